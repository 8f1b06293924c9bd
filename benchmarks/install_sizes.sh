#!/usr/bin/env bash
# The README's two installs from a fresh clone, each in its own new virtual environment, timed and
# weighed: `pip install -e .` (what `tinyformer train` needs) and `pip install -e ".[test]"` (what
# the test command adds). pip's cache is off, so every wheel is downloaded as on a fresh machine.
#
#   benchmarks/install_sizes.sh [REPOSITORY [REVISION]]   (default: this checkout, HEAD)
#
# Prints one Markdown table row per environment (seconds of `pip install`, size on disk, packages)
# and the provenance lines; nothing is written in the repository. Needs git, python3 and network
# access to the package index; takes minutes (the test extra brings PyTorch).
set -euo pipefail
repo="${1:-$(cd "$(dirname "$0")/.." && pwd)}"
revision="${2:-HEAD}"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
export PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1

git clone --quiet "$repo" "$work/clone"
git -C "$work/clone" checkout --quiet "$revision"
commit="$(git -C "$work/clone" rev-parse --short HEAD)"

measure() {  # NAME PIP-TARGET
    local venv="$work/venv-$1" start end
    python3 -m venv "$venv"
    start=$(date +%s.%N)
    (cd "$work/clone" && "$venv/bin/pip" install --quiet -e "$2")
    end=$(date +%s.%N)
    local bytes packages
    bytes=$(du -sb "$venv" | cut -f1)
    packages=$("$venv/bin/pip" list --format=freeze 2>/dev/null | grep -vc "^tinyformer" || true)
    printf '| `pip install -e %s` | %.0f s | %.0f MB | %s |\n' "$2" "$(echo "$end - $start" | bc)" \
        "$(echo "$bytes / 1000000" | bc -l)" "$packages"
}

echo "| install (fresh virtual environment, no pip cache) | time | size on disk | packages |"
echo "|---|---:|---:|---:|"
measure main .
measure test ".[test]"
echo
echo "commit $commit; $(date -u +%Y-%m-%d); $(python3 --version); $(nproc) cores; $(uname -sm)"
