#!/usr/bin/env bash
# Install mappa on a bare GPU machine that has no network: the wheels of requirements/gpu.txt
# from .whl/ (`make gpu-wheels` fetches them), then this checkout, into `python3` itself
# (not --target + PYTHONPATH: the sandbox's Jupyter kernels would not see PYTHONPATH).
#
# Run from anywhere:  bash benchmarks/gpu_install.sh      (WHEELS=dir to read another folder)
# With --trl, also requirements/gpu-trl.txt (TRL for benchmarks/bench_vs_trl.py; wheels from
# `make gpu-wheels-trl`).
# Prints the seconds each phase took; any failure is one line saying what to do, and exit 1.
set -euo pipefail

repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
wheels=${WHEELS:-$repo/.whl}
requirements=("$repo/requirements/gpu.txt")
imports=mappa_env,mappa_agents,mappa_train,ipykernel,jupyter_client,math_verify,pettingzoo
fetch="make gpu-wheels"
for arg in "$@"; do
    case $arg in
    --trl)
        requirements+=("$repo/requirements/gpu-trl.txt")
        imports+=,trl,datasets
        fetch="make gpu-wheels-trl"
        ;;
    *)
        echo "gpu_install: unknown option $arg (the one option is --trl)" >&2
        exit 1
        ;;
    esac
done
py=${PYTHON:-python3}
pip=("$py" -m pip --disable-pip-version-check --no-cache-dir --no-input)
export PIP_ROOT_USER_ACTION=ignore

fail() {
    echo "gpu_install: $*" >&2
    exit 1
}
trap 'fail "failed at line $LINENO: $BASH_COMMAND"' ERR

phase_start=$EPOCHREALTIME
phase() {
    local now=$EPOCHREALTIME
    printf 'gpu_install: %-9s %6.2f s\n' "$1" "$(awk "BEGIN { print $now - $phase_start }")"
    phase_start=$now
}
total_start=$EPOCHREALTIME

# Every pinned requirement has its wheel (names as pip normalises them: lower case, runs
# of - _ . as one _), and no package has two.
normalise() { tr 'A-Z' 'a-z' | sed -E 's/[-_.]+/_/g'; }
[[ -d $wheels ]] || fail "no wheel folder $wheels: run '$fetch' here before the call and carry .whl"
mapfile -t wanted < <(cat "${requirements[@]}" | grep -Ev '^[[:space:]]*(#|$)' | sed -E 's/[[:space:]]*#.*//')
shopt -s nullglob
files=("$wheels"/*.whl)
# Only the wheels the file names are installed: another one left in the folder (numpy, say)
# would replace the image's own build.
declare -A by_key=()
for f in "${files[@]}"; do
    base=$(basename "$f")
    rest=${base#*-}
    by_key["$(normalise <<<"${base%%-*}")-${rest%%-*}"]=$f
done
have=$(printf '%s\n' "${!by_key[@]}" | sort)
install=()
for line in "${wanted[@]}"; do
    key="$(normalise <<<"${line%%==*}")-${line#*==}"
    [[ -n ${by_key[$key]:-} ]] ||
        fail "missing wheel for $line in $wheels: run '$fetch' and carry .whl"
    install+=("${by_key[$key]}")
done
dupes=$(printf '%s\n' "$have" | cut -d- -f1 | uniq -d | tr '\n' ' ')
[[ -z $dupes ]] || fail "two versions of ${dupes% } in $wheels: run 'make gpu-wheels' (it clears old ones)"
phase check

"${pip[@]}" install --quiet --no-index --no-deps --no-compile "${install[@]}" ||
    fail "pip could not install the wheels in $wheels (see above)"
phase wheels

# The checkout, editable, without build isolation (no index to fetch setuptools from):
# pyproject.toml's license fields need setuptools >= 77. With an older one, a .pth file
# puts the checkout on python3's path, which its kernels read too.
setuptools=$("$py" -c 'import setuptools; print(setuptools.__version__)' 2>/dev/null || echo 0)
how=".pth (setuptools $setuptools < 77)"
if [[ ${setuptools%%.*} -ge 77 ]]; then
    if "${pip[@]}" install --quiet --no-index --no-deps --no-build-isolation -e "$repo"; then
        how="editable (setuptools $setuptools)"
    else
        how=".pth (the editable install failed)"
    fi
fi
if [[ $how == .pth* ]]; then
    site=$("$py" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
    printf '%s\n' "$repo" >"$site/mappa-checkout.pth"
fi
phase checkout
echo "gpu_install: mappa installed: $how"

# Conflicts between these packages and the image's own (e.g. a version one of them needs).
ours=$( (printf '%s\n' "${wanted[@]%%==*}"; echo mappa-rl) | normalise | sort -u)
conflicts=$("${pip[@]}" check 2>&1 | while read -r who rest; do
    grep -qxF "$(normalise <<<"$who")" <<<"$ours" && echo "  $who $rest"
done || true)
[[ -z $conflicts ]] || printf 'gpu_install: version conflicts with the image:\n%s\n' "$conflicts"
phase pip-check

# bubblewrap from the Debian package `make gpu-wheels` saved, where the image has none:
# unpacked beside the system (not over it) and linked onto the PATH.
if ! command -v bwrap >/dev/null; then
    debs=("$wheels"/bubblewrap_*.deb)
    if ((${#debs[@]})); then
        dpkg-deb -x "${debs[0]}" /opt/bubblewrap || fail "could not unpack ${debs[0]}"
        ln -sf /opt/bubblewrap/usr/bin/bwrap /usr/local/bin/bwrap
        bwrap --ro-bind / / true || echo "gpu_install: bwrap is installed but cannot confine here"
        echo "gpu_install: bubblewrap $(bwrap --version | cut -d' ' -f2) from ${debs[0]##*/}"
    else
        echo "gpu_install: no bubblewrap package in $wheels: agents' code will run unconfined"
    fi
fi
phase bwrap

cd /
"$py" -c "import $imports" ||
    fail "the installed packages do not import (see above)"
phase imports
printf 'gpu_install: %-9s %6.2f s\n' total "$(awk "BEGIN { print $EPOCHREALTIME - $total_start }")"
