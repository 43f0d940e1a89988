#!/usr/bin/env bash
# Installs every system package vlm needs to build and test, from Debian's archive.
# Safe to run repeatedly; skips apt entirely when everything is already present.
set -euo pipefail
PKGS=(
  build-essential cmake ninja-build ccache pkg-config
  libgtest-dev libgmock-dev
  libpcre2-dev libutf8proc-dev
  libturbojpeg0-dev libspng-dev libwebp-dev libgif-dev libstb-dev
  libavformat-dev libavcodec-dev libswscale-dev libavutil-dev
  nlohmann-json3-dev libcli11-dev libboost-dev libssl-dev zlib1g-dev libbrotli-dev
  python3-venv python3-pip
  nettle-dev libcurl4-openssl-dev libyaml-cpp-dev
  libzmq3-dev libmsgpack-cxx-dev
  libjs-chart.js libjs-markdown-it chromium chromium-driver
  clang-format clang-tidy
)
missing=()
for p in "${PKGS[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  SUDO=""
  [ "$(id -u)" -ne 0 ] && SUDO="sudo"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi
