#!/usr/bin/env bash
# device.sh — the GPU checks of a session lent a GPU machine, prepared here
# and run there in one call (the machine is bare: no Debian packages, no
# network, CUDA 13 and its libraries present).
#
#   bash mk/device.sh pack     here: build, then bundle the binaries, the
#                              shared libraries they need that are not glibc's
#                              or CUDA's, and Debian's English fortune collections into
#                              build/device/bundle.tar.xz (carry build/device)
#   bash mk/device.sh check [NAME...]
#                              there: unpack, find CUDA's libraries, and run
#                              each check under its own time limit, one log
#                              per check under $OUT (at most 8 files come back);
#                              NAMEs: only those checks (test-gpu codec-cuda
#                              bench-gpu train train-cpu demo); a check that
#                              runs past its limit has its stacks in its log
#
# The device tool's call, from the repository root:
#   run(command="bash mk/device.sh check", carry=["build/device"], timeout_s=600)
# Its checks' limits add up to 550 s; each ends far sooner when it works.
# The checks: nvidia-smi and `strait version`; the GPU tests (make test-gpu's
# binary); the unit tests' CPU-against-GPU codec checks; bench/gpu; a short
# `strait train --device cuda` (TF32, fp32 matmuls, bf16 products) beside the
# same run on the CPU, and LoRA adapters the same way; a two-site `strait
# demo --device cuda`.
set -uo pipefail
cd "$(dirname "$0")/.."
mode=${1:-}

pack() {
    set -e
    make -j"$(nproc)" all >/dev/null
    local d=build/device/stage
    rm -rf build/device && mkdir -p "$d/bin" "$d/lib" "$d/fortunes"
    cp build/strait build/libstrait-cuda.so build/tests/gpu_ops build/tests/unit "$d/bin/"
    cp build/bench/gpu "$d/bin/bench-gpu"
    # eu-stack (elfutils): a step that runs past its limit has every thread
    # of its processes' stacks printed into its log before it is ended
    if ! command -v eu-stack >/dev/null; then
        if [ "$(id -u)" = 0 ]; then apt-get install -y -q elfutils >/dev/null; fi
    fi
    command -v eu-stack >/dev/null && cp "$(command -v eu-stack)" "$d/bin/"
    # every library the binaries load, but glibc's own, the compiler's
    # runtime (the machine's is newer, and CUDA's libraries need it) and
    # CUDA's (the machine's match its driver)
    for b in "$d"/bin/*; do ldd "$b"; done | awk '$3 ~ /^\// {print $3}' | sort -u |
        grep -Ev '/(libc|libm|libpthread|libdl|librt|libresolv|libstdc\+\+|libgcc_s|ld-linux[^/]*)\.so|/libcu|/libnccl' |
        while read -r lib; do cp -L "$lib" "$d/lib/"; done
    # the English collections (the demo's sites train on twelve of them and
    # score on platitudes and miscellaneous); their indexes are not needed
    find /usr/share/games/fortunes -maxdepth 1 -type f ! -name '*.dat' ! -name '*.u8' \
        -exec cp {} "$d/fortunes/" \;
    git rev-parse --short HEAD > "$d/commit"
    tar -C "$d" -cJf build/device/bundle.tar.xz .
    rm -rf "$d"
    echo "device.sh: build/device/bundle.tar.xz, $(du -h build/device/bundle.tar.xz | cut -f1)" \
        "(carry build/device; the limit is 64 MiB with the working tree)"
}

# stacks FILE: every thread's stack of every process started from the
# bundle that is still running (eu-stack, else each thread's name and
# kernel wait channel), appended to FILE
stacks() {
    local p
    for p in $(pgrep -f /tmp/strait-device/bin/); do
        [ "$p" = "$$" ] && continue
        echo "== pid $p: $(tr '\0' ' ' < "/proc/$p/cmdline" 2>/dev/null)"
        if [ -x /tmp/strait-device/bin/eu-stack ]; then
            timeout 20 /tmp/strait-device/bin/eu-stack -p "$p" 2>&1 | head -400
        else
            for t in /proc/"$p"/task/*; do
                echo "  $(cat "$t/comm" 2>/dev/null) $(cat "$t/wchan" 2>/dev/null)"
            done
        fi
    done >> "$1" 2>&1
}

# step NAME SECONDS COMMAND...: runs it, its output into $OUT/NAME.txt, and
# one line of the summary; 10 s before its limit, the stacks of what still
# runs go into the same log
step() {
    local name=$1 limit=$2
    shift 2
    if [ -n "$ONLY" ] && [[ " $ONLY " != *" $name "* ]]; then return; fi
    local t0=$SECONDS
    (
        trap 'kill "$nap" 2>/dev/null; exit 0' TERM
        sleep $((limit - 10)) &
        nap=$!
        wait "$nap"
        echo "== $name: still running after $((limit - 10)) s; stacks:"
        stacks "$OUT/$name.txt"
    ) < /dev/null >> "$OUT/$name.txt" 2>&1 &
    local dog=$!
    timeout -k 5 "$limit" "$@" >> "$OUT/$name.txt" 2>&1
    local rc=$?
    kill "$dog" 2>/dev/null
    wait "$dog" 2>/dev/null
    printf '%-10s rc=%-3s %4ss  %s\n' "$name" "$rc" "$((SECONDS - t0))" "$*" | tee -a "$OUT/summary.txt"
}

check() {
    : "${OUT:?device.sh check runs on the device machine, where \$OUT is set}"
    local s=/tmp/strait-device
    rm -rf "$s" && mkdir -p "$s" && tar -C "$s" -xJf build/device/bundle.tar.xz || {
        echo "no bundle: run 'bash mk/device.sh pack' here and carry build/device" | tee "$OUT/summary.txt"
        exit 2
    }
    # CUDA's libraries: the toolkit's, or those of the Python wheels
    local cudalibs
    cudalibs=$(find /usr/local /opt /usr/lib -maxdepth 8 \( -name 'libcublas.so.13' -o -name 'libnccl.so.2' -o -name 'libcudart.so.13' \) 2>/dev/null |
        xargs -r -n1 dirname | sort -u | paste -sd:)
    export LD_LIBRARY_PATH="$s/lib${cudalibs:+:$cudalibs}${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
    export STRAIT_CUDA_PLUGIN="$s/bin/libstrait-cuda.so" STRAIT_LOG=${STRAIT_LOG:-info}
    if [ ! -r /usr/share/games/fortunes/platitudes ]; then # where strait demo reads them
        mkdir -p /usr/share/games/fortunes
        for f in "$s"/fortunes/*; do
            [ -e "/usr/share/games/fortunes/${f##*/}" ] || cp "$f" /usr/share/games/fortunes/
        done
    fi
    local bin=$s/bin
    {
        echo "commit $(cat "$s/commit"); cuda libraries: ${cudalibs:-none found}"
        nvidia-smi 2>&1
        ldd --version 2>&1 | head -1
        ldd "$bin/strait" "$bin/libstrait-cuda.so" 2>&1 | grep -E 'not found|=>' | grep -E 'not found|cu|nccl'
        "$bin/strait" version 2>&1
    } > "$OUT/system.txt" 2>&1
    : > "$OUT/summary.txt"
    step test-gpu 160 env STRAIT_LOG=error OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 "$bin/gpu_ops" --short-filename --verbose
    # the attention kernels under compute-sanitizer's memcheck, where the
    # machine's toolkit has it (out-of-bounds reads and writes the
    # comparisons cannot see)
    local cs
    cs=$(command -v compute-sanitizer || ls /usr/local/cuda*/bin/compute-sanitizer 2> /dev/null | head -1)
    if [ -n "$cs" ]; then
        step memcheck 35 env STRAIT_LOG=error OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 \
            "$cs" --tool memcheck --error-exitcode 1 \
            "$bin/gpu_ops" --short-filename --filter 'cuda_ops/attention*'
    else
        echo "memcheck: skipped (no compute-sanitizer on this machine)" >> "$OUT/summary.txt"
    fi
    step codec-cuda 40 env STRAIT_LOG=error OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 "$bin/unit" --filter 'codec_cuda/*' --verbose
    step bench-gpu 110 "$bin/bench-gpu"
    # the same run on the GPU and on the CPU (same seed, data and steps):
    # their losses should track each other
    local f=/usr/share/games/fortunes
    local data=(--model small --steps 60 --val-every 20 --data "$f/fortunes" --data "$f/literature")
    # TF32 matmuls (the GPU default), then fp32 (the CPU's losses to four
    # decimals); then LoRA adapters over a frozen llama-small in fp32, on
    # both (one log a step: at most 8 files come back)
    local lora=(--model llama-small --vocab 5000 --lora-rank 8 --lora-base-dtype f32 --steps 40 --val-every 20
        --data "$f/fortunes" --data "$f/literature")
    step train 75 bash -c "'$bin/strait' train --device cuda ${data[*]} &&
        '$bin/strait' train --device cuda --matmul fp32 ${data[*]} &&
        '$bin/strait' train --device cuda --precision bf16 ${data[*]} &&
        '$bin/strait' train --device cuda --matmul fp32 ${lora[*]}"
    step train-cpu 40 bash -c "'$bin/strait' train --device cpu ${data[*]} &&
        '$bin/strait' train --device cpu ${lora[*]}"
    rm -rf /tmp/strait-device-demo
    step demo 90 "$bin/strait" demo --device cuda --sites 2 --rounds 3 --model small --steps 20 \
        --dir /tmp/strait-device-demo
    for l in /tmp/strait-device-demo/site-*.log; do
        [ -r "$l" ] && { echo "== $l"; tail -n 20 "$l"; } >> "$OUT/demo.txt"
    done
    cat "$OUT/summary.txt"
}

case "$mode" in
pack) pack ;;
check)
    shift
    ONLY="$*" # names of checks to run; all when none
    check
    ;;
*)
    echo "usage: bash mk/device.sh pack (here) | check (on the device machine)" >&2
    exit 2
    ;;
esac
