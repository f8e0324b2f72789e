# kind "base" image rebuilt from Debian packages only (kind's upstream base image downloads
# containerd/runc/CNI release binaries, which we cannot reach). The files/ directory is kind's
# own images/base/files from the sigs.k8s.io/kind module, copied in by hack/kind-node-image.sh.
ARG BASE_IMAGE
FROM ${BASE_IMAGE}
# policy-rc.d: no daemon may start during the build. Check-Valid-Until/Date: the Debian mirror
# reachable here can serve Release files older than their Valid-Until (as the host's apt.conf.d
# also allows).
RUN printf '#!/bin/sh\nexit 101\n' > /usr/sbin/policy-rc.d && chmod 755 /usr/sbin/policy-rc.d \
 && printf 'Acquire::Check-Valid-Until "false";\nAcquire::Check-Date "false";\n' > /etc/apt/apt.conf.d/99revault \
 && DEBIAN_FRONTEND=noninteractive apt-get update \
 && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends \
      systemd containerd runc containernetworking-plugins \
      conntrack iptables nftables iproute2 ethtool util-linux mount kmod libseccomp2 pigz \
      e2fsprogs bash ca-certificates curl jq procps \
 && apt-get clean && rm -rf /var/lib/apt/lists/* /usr/sbin/policy-rc.d
COPY files/usr/local/bin/ /usr/local/bin/
COPY files/kind/ /kind/
COPY files/etc/ /etc/
# The rest mirrors kind's images/base/Dockerfile: a minimal systemd as PID 1 with only
# containerd + kubelet enabled, CNI plugins where kind expects them (/opt/cni/bin), and the
# OCI base spec kind's containerd config points to (base_runtime_spec).
RUN chmod 0755 /usr/local/bin/* /kind /kind/bin /kind/bin/* \
 && find /lib/systemd/system/sysinit.target.wants/ -name "systemd-tmpfiles-setup.service" -delete \
 && rm -f /lib/systemd/system/multi-user.target.wants/* /etc/systemd/system/*.wants/* \
      /lib/systemd/system/local-fs.target.wants/* /lib/systemd/system/sockets.target.wants/*udev* \
      /lib/systemd/system/sockets.target.wants/*initctl* /lib/systemd/system/basic.target.wants/* \
 && echo "ReadKMsg=no" >> /etc/systemd/journald.conf \
 && ln -sf /usr/lib/systemd/systemd /sbin/init \
 && ln -sf /usr/bin/containerd /usr/local/bin/containerd \
 && mkdir -p /opt/cni/bin && cp /usr/lib/cni/* /opt/cni/bin/ \
 && systemctl enable kubelet.service containerd.service undo-mount-hacks.service \
 && systemctl mask systemd-binfmt.service \
 && mkdir -p /etc/kubernetes/manifests \
 && ctr oci spec | jq '.hooks.createContainer[.hooks.createContainer| length] |= . + {"path": "/kind/bin/mount-product-files.sh"}' | jq 'del(.process.rlimits)' > /etc/containerd/cri-base.json
ENV container=docker
STOPSIGNAL SIGRTMIN+3
ENTRYPOINT [ "/usr/local/bin/entrypoint", "/sbin/init" ]
