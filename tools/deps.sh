#!/usr/bin/env bash
# Installs what mtopt needs to build, test and run its example, from the
# distribution's packages (Debian, Ubuntu). Only missing packages are installed.
set -euo pipefail
pkgs=(cmake make gcc g++ pkg-config check libsubunit-dev libopenmpi-dev openmpi-bin
      libopenblas-dev zlib1g-dev dataset-fashion-mnist gnuplot-nox python3
      python3-venv)
missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
[ ${#missing[@]} -eq 0 ] && exit 0
echo "deps: installing ${missing[*]}"
sudo=""
[ "$(id -u)" -eq 0 ] || sudo="sudo"
export DEBIAN_FRONTEND=noninteractive
$sudo apt-get update -qq
$sudo apt-get install -y -qq --no-install-recommends "${missing[@]}"
