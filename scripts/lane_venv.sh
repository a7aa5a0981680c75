# Sourced by the test lanes that run in a venv of their own (test_xla.sh, test_cluster.sh).
# lane_venv VENV MODULE WHAT: make VENV afresh unless MODULE imports in it (WHAT says what
# the lane then installs there).
lane_venv() {
    local venv="$1" module="$2" what="$3"
    if ! "$venv/bin/python" -c "import $module" >/dev/null 2>&1; then
        echo "$(basename "$0"): building $venv ($what)" >&2
        rm -rf "$venv"
        mkdir -p "$(dirname "$venv")"
        python3 -m venv "$venv"
    fi
}
