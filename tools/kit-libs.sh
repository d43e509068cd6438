# Sourced by tools/bench-kit.sh and tools/test-kit.sh (not run on its own).
#
# kit_copy_libs DEST FILE...: copy into DEST every shared library the FILEs
# link, except glibc's own (libc, libm, libpthread, libdl, librt, the
# loader): those must be the running host's, and a binary built here runs
# on any host whose glibc is at least as new. Files that are not dynamic
# executables (a static archive) are skipped.
kit_copy_libs() {
  local dest=$1 lib
  shift
  { ldd "$@" 2>/dev/null || true; } |
    awk '/=>/ && $3 ~ /^\// {print $3}' | sort -u |
    { grep -vE '/(libc|libm|libpthread|libdl|librt|ld-linux[^/]*)\.so' || true; } |
    while read -r lib; do cp -L "$lib" "$dest/"; done
}
