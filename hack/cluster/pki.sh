#!/usr/bin/env bash
# The cluster tier's certificates and keys, made with openssl under PKI_DIR.
# Sourced by hack/cluster.sh; defines pki_control_plane and pki_node.
#
#   ca.{crt,key}                 the one CA (client and serving certificates)
#   apiserver.{crt,key}          kube-apiserver serving, SAN 127.0.0.1, localhost
#   apiserver-kubelet.{crt,key}  kube-apiserver → kubelets (O=system:masters)
#   admin.{crt,key}              kubectl (O=system:masters)
#   controller-manager.{crt,key} CN=system:kube-controller-manager
#   scheduler.{crt,key}          CN=system:kube-scheduler
#   sa.{key,pub}                 ServiceAccount token signing key
#   node-NAME.{crt,key}          kubelet client, CN=system:node:NAME O=system:nodes
#   node-NAME-serving.{crt,key}  kubelet serving, SAN 127.0.0.1

# pki_cert NAME SUBJECT [SAN]: a key and a certificate signed by the CA.
pki_cert() {
    local name="$1" subj="$2" san="${3:-}" ext
    ext="$PKI_DIR/$name.ext"
    {
        echo "basicConstraints=critical,CA:FALSE"
        echo "keyUsage=critical,digitalSignature,keyEncipherment"
        if [[ -n "$san" ]]; then
            echo "extendedKeyUsage=serverAuth"
            echo "subjectAltName=$san"
        else
            echo "extendedKeyUsage=clientAuth"
        fi
    } >"$ext"
    openssl req -new -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes \
        -keyout "$PKI_DIR/$name.key" -subj "$subj" -out "$PKI_DIR/$name.csr" 2>/dev/null
    openssl x509 -req -in "$PKI_DIR/$name.csr" -CA "$PKI_DIR/ca.crt" -CAkey "$PKI_DIR/ca.key" \
        -CAcreateserial -days 2 -extfile "$ext" -out "$PKI_DIR/$name.crt" 2>/dev/null
    rm -f "$PKI_DIR/$name.csr" "$ext"
    chmod 0600 "$PKI_DIR/$name.key"
}

pki_control_plane() {
    mkdir -p "$PKI_DIR"
    chmod 0700 "$PKI_DIR"
    openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -days 2 \
        -keyout "$PKI_DIR/ca.key" -out "$PKI_DIR/ca.crt" -subj "/CN=criguard-cluster-ca" \
        -addext "basicConstraints=critical,CA:TRUE" \
        -addext "keyUsage=critical,keyCertSign,cRLSign,digitalSignature" 2>/dev/null
    # 10.0.2.100: the API server's address in the VM node (QEMU's guestfwd,
    # hack/cluster/vm-node.sh), where pods with the in-cluster config dial it.
    pki_cert apiserver "/CN=kube-apiserver" "IP:127.0.0.1,DNS:localhost,DNS:kubernetes,DNS:kubernetes.default,IP:10.96.0.1,IP:10.0.2.100"
    pki_cert apiserver-kubelet "/O=system:masters/CN=kube-apiserver-kubelet-client"
    pki_cert admin "/O=system:masters/CN=criguard-cluster-admin"
    pki_cert controller-manager "/CN=system:kube-controller-manager"
    pki_cert scheduler "/CN=system:kube-scheduler"
    openssl genrsa -out "$PKI_DIR/sa.key" 2048 2>/dev/null
    openssl rsa -in "$PKI_DIR/sa.key" -pubout -out "$PKI_DIR/sa.pub" 2>/dev/null
    chmod 0600 "$PKI_DIR/sa.key"
}

# pki_node NAME: the kubelet's client and serving certificates.
pki_node() {
    pki_cert "node-$1" "/O=system:nodes/CN=system:node:$1"
    pki_cert "node-$1-serving" "/CN=$1" "IP:127.0.0.1,DNS:localhost,DNS:$1"
}
