# kind node image = base + our kubeadm/kubelet/kubectl + containerd config. The control-plane
# images are imported into containerd afterwards by hack/kind-node-image.sh (a build step
# cannot run containerd). No CNI config is baked in: hack/kind-up.sh writes one per node with
# that node's podCIDR, so no pod ever starts with an address from another node's range.
ARG BASE_IMAGE
FROM ${BASE_IMAGE}
ARG K8S_VERSION
COPY kubeadm kubelet kubectl /usr/bin/
COPY config.toml /etc/containerd/config.toml
RUN echo "${K8S_VERSION}" > /kind/version && chmod 755 /usr/bin/kubeadm /usr/bin/kubelet /usr/bin/kubectl
