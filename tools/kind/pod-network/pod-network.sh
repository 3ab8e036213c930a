#!/bin/sh
# The pod network agent of the kind node image (in place of kind's kindnetd), one on each node,
# in the node's network namespace: writes the node's CNI configuration for its podCIDR (ptp
# with host-local addresses, portmap for hostPort), routes each other node's podCIDR through
# that node's address, and masquerades what pods send outside the cluster's pod subnet. It reads
# the nodes every 5 s, so a node that joins or comes back is routed within seconds. IPv4 only.
set -eu
: "${NODE_NAME:?}" "${POD_SUBNET:?}"
conf=/etc/cni/net.d/10-tpujob-pods.conflist

write_conf() {
  cat >"$conf.tmp" <<JSON
{
  "cniVersion": "1.0.0",
  "name": "tpujob-pods",
  "plugins": [
    {
      "type": "ptp",
      "ipMasq": false,
      "ipam": {
        "type": "host-local",
        "dataDir": "/run/cni-ipam-state",
        "ranges": [[{"subnet": "$1"}]],
        "routes": [{"dst": "0.0.0.0/0"}]
      }
    },
    {"type": "portmap", "capabilities": {"portMappings": true}}
  ]
}
JSON
  if ! cmp -s "$conf.tmp" "$conf"; then
    mv "$conf.tmp" "$conf"
    echo "CNI configuration written for $1"
  else
    rm -f "$conf.tmp"
  fi
}

while :; do
  nodes=$(kubectl get nodes -o jsonpath='{range .items[*]}{.metadata.name} {.spec.podCIDR} {.status.addresses[?(@.type=="InternalIP")].address}{"\n"}{end}') || nodes=""
  echo "$nodes" | while read -r name cidr address _; do
    [ -n "$cidr" ] && [ -n "$address" ] || continue
    if [ "$name" = "$NODE_NAME" ]; then
      write_conf "$cidr"
      if ! iptables -t nat -C POSTROUTING -s "$cidr" ! -d "$POD_SUBNET" -j MASQUERADE 2>/dev/null; then
        iptables -t nat -A POSTROUTING -s "$cidr" ! -d "$POD_SUBNET" -j MASQUERADE
      fi
    elif ! ip route show "$cidr" | grep -q "via $address "; then
      ip route replace "$cidr" via "$address"
      echo "route $cidr via $address ($name)"
    fi
  done
  sleep 5
done
