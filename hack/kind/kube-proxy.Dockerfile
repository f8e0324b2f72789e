# kube-proxy execs iptables-restore/conntrack/ipset, so unlike the other control-plane images
# (single static binaries, made by hack/mkimage.py) it needs a small Debian userland.
ARG BASE_IMAGE
FROM ${BASE_IMAGE}
RUN printf 'Acquire::Check-Valid-Until "false";\nAcquire::Check-Date "false";\n' > /etc/apt/apt.conf.d/99revault \
 && apt-get update && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends \
      iptables conntrack ipset kmod \
 && apt-get clean && rm -rf /var/lib/apt/lists/*
COPY kube-proxy /usr/local/bin/kube-proxy
