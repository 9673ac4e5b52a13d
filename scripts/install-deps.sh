#!/usr/bin/env bash
# Installs the Debian packages fsdpd builds and tests with (run as root, or with sudo).
set -euo pipefail
SUDO=""
[ "$(id -u)" -eq 0 ] || SUDO=sudo
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq --no-install-recommends \
    build-essential pkg-config clang libclang-rt-dev \
    libevent-dev libjansson-dev libopenblas-dev libcmocka-dev \
    libpmix-dev libfabric-dev libpcre2-dev libcurl4-openssl-dev \
    python3 python3-venv ca-certificates util-linux procps iproute2 \
    slurm-client slurmctld slurmd munge >/dev/null
