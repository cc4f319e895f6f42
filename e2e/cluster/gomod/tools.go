//go:build tools

// Package tools pins the control-plane programs that e2e/cluster builds from
// k8s.io/kubernetes (and etcd at the version that release requires). Nothing
// imports this package; `go build <cmd path>` in this module builds each program.
package tools

import (
	_ "go.etcd.io/etcd/server/v3"
	_ "k8s.io/kubernetes/cmd/kube-apiserver"
	_ "k8s.io/kubernetes/cmd/kube-controller-manager"
	_ "k8s.io/kubernetes/cmd/kube-scheduler"
	_ "k8s.io/kubernetes/cmd/kubectl"
	_ "k8s.io/kubernetes/cmd/kubelet"
)
