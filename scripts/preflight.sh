# Checks and installs shared by the scripts that run outside suites against
# tablix (install-deps.sh, pjdfstest.sh, fsx.sh, xfstests.sh), sourced
# after they set `tool` (their name, for messages).

# Fails unless this runs as root with /dev/fuse, and the tablix binary
# `$bin` exists: need_mounting WHY-ROOT.
need_mounting() {
    if [[ $(id -u) -ne 0 ]]; then
        echo "$tool: needs root ($1)" >&2
        exit 1
    fi
    if [[ ! -c /dev/fuse ]]; then
        echo "$tool: /dev/fuse is missing" >&2
        exit 1
    fi
    if [[ ! -x $bin ]]; then
        echo "$tool: no tablix binary at $bin (make build)" >&2
        exit 1
    fi
}

# Installs those of the Debian packages named that are not installed:
# need_packages PACKAGE...
need_packages() {
    local missing=() p sudo=
    for p in "$@"; do
        dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
    done
    ((${#missing[@]})) || return 0
    echo "$tool: installing ${missing[*]}" >&2
    [[ $(id -u) -eq 0 ]] || sudo=sudo
    $sudo apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq "${missing[@]}"
}

# Whether DIR is a clone checked out at REV: at_rev DIR REV.
at_rev() {
    [[ $(git -C "$1" rev-parse HEAD 2>/dev/null) == "$2" ]]
}

# Replaces DIR with a clone of REPO checked out at REV:
# fresh_clone DIR REPO REV.
fresh_clone() {
    rm -rf "$1"
    mkdir -p "$(dirname "$1")"
    git clone -q "$2" "$1"
    git -C "$1" checkout -q "$3"
}
