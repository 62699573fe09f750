#!/bin/sh
# The image's entry point: `proctor serve` (exec'd, so it is PID 1 and gets SIGTERM itself), with one
# adjustment first. torch's extension loader takes a lock file in the kernel cache on every load, so
# when the image's cache is not writable (a read-only root filesystem, as deploy/k8s runs it) the
# prebuilt kernels are copied to ${TMPDIR:-/tmp} with their times kept: ninja finds them up to date and
# nothing is compiled (there is no compiler in the image). Without this, q8/q4 fall back to fp16.
set -eu
cache="${PROCTOR_KERNEL_CACHE:-/opt/proctor/kernels}"
writable=1
for dir in "$cache" "$cache"/*/ "$cache"/*/*/; do
    [ -d "$dir" ] && [ ! -w "$dir" ] && writable=0
done
if [ "$writable" = 0 ]; then
    copy="${TMPDIR:-/tmp}/proctor-kernels"
    mkdir -p "$copy"
    cp -a "$cache/." "$copy/"
    export PROCTOR_KERNEL_CACHE="$copy"
fi
exec proctor serve "$@"
