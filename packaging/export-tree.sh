# shellcheck shell=bash
# export-tree.sh — sourced by build-deb.sh, build-rpm.sh and the package
# tests (tests/system/test-deb.sh, test-rpm.sh).
#
# A package is built from the project as git would commit it now: what git
# tracks plus new files it does not ignore, as they are in the working
# tree (without git: everything but build directories). The project itself
# is never written to.

# tree_files ROOT: those files, NUL-separated, relative to ROOT, sorted.
tree_files() {
        local root=$1
        if git -C "$root" rev-parse --is-inside-work-tree >/dev/null 2>&1; then
                # Tracked files deleted in the working tree are left out.
                git -C "$root" ls-files -z --cached --others --exclude-standard |
                        (cd "$root" && while IFS= read -r -d '' f; do
                                if [ -e "$f" ] || [ -L "$f" ]; then printf '%s\0' "$f"; fi
                        done) | sort -z -u
        else
                (cd "$root" && find . \( -name .git -o -name .cache -o -name 'build*' \) -prune -o \
                        \( -type f -o -type l \) -printf '%P\0' | sort -z)
        fi
}

# export_tree ROOT DEST: copy them into DEST (created).
export_tree() {
        mkdir -p "$2" || return 1
        tree_files "$1" | tar -C "$1" --null --no-recursion -cf - -T - | tar -C "$2" -xf -
}

# tree_hash ROOT: a hash of the names, modes and contents of those a
# package is made of: the same hash, the same package. Left out: the tests
# (-Dtests=disabled), CI and the OCI image's directory.
tree_hash() {
        (cd "$1" && tree_files . | grep -z -v -E '^(tests|containers|\.ci)/' |
                xargs -0 -r sh -c 'stat -c "%A %n" "$@" && sha256sum "$@"' sh) | sha256sum | cut -c1-16
}

# project_version ROOT: the version in meson.build's project().
project_version() {
        sed -n "/^project(/,/)/ s/^ *version: *'\([^']*\)'.*/\1/p" "$1/meson.build" | head -n 1
}
