#!/usr/bin/env bash
# The real node's runtime from the Debian archive (e2e/cluster/real_node.py, NODE_PACKAGES):
# containerd, runc and the CNI plugins. Installs what is missing, as root, and nothing else.
set -euo pipefail
packages=(containerd runc containernetworking-plugins iptables)
missing=()
for p in "${packages[@]}"; do
    status=$(dpkg-query -W -f='${Status}' "$p" 2>/dev/null || true)
    [[ "$status" == "install ok installed" ]] || missing+=("$p")
done
if [[ ${#missing[@]} -eq 0 ]]; then
    exit 0
fi
if [[ "$(id -u)" != 0 ]]; then
    echo "node-packages: ${missing[*]} not installed and this user is not root;" \
         "run as root: apt-get install ${missing[*]}" >&2
    exit 1
fi
echo "node-packages: installing ${missing[*]} from the Debian archive" >&2
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
