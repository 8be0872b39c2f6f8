# Shared by the bench scripts: `measure BYTES CMD ARGS...` runs CMD under /usr/bin/time -v and
# prints "MB/s wall (s), MB/s cpu (user+sys s), peak RSS MiB" for the BYTES it processes. The
# command's standard output and its `rootline:` diagnostic lines are passed on to stderr.

# Fails with a hint when /usr/bin/time (GNU time, needed for peak RSS) is missing.
require_gnu_time() {
    if [ ! -x /usr/bin/time ]; then
        echo "$(basename "$0"): /usr/bin/time is needed (apt-get install -y time)" >&2
        exit 1
    fi
}

measure() {
    local bytes=$1
    shift
    local log
    log=$(mktemp)
    /usr/bin/time -v "$@" >"$log.out" 2>"$log"
    local wall user sys rss
    wall=$(awk -F': ' '/Elapsed \(wall clock\)/ {n=split($2,a,":"); s=0; for(i=1;i<=n;i++) s=s*60+a[i]; print s}' "$log")
    user=$(awk -F': ' '/User time/ {print $2}' "$log")
    sys=$(awk -F': ' '/System time/ {print $2}' "$log")
    rss=$(awk -F': ' '/Maximum resident set size/ {print $2}' "$log")
    cat "$log.out" >&2
    grep '^rootline:' "$log" >&2 || true
    awk -v b="$bytes" -v w="$wall" -v u="$user" -v s="$sys" -v r="$rss" 'BEGIN {
        printf "%.0f MB/s wall (%.2f s), %.0f MB/s cpu (user+sys %.2f s), peak RSS %.0f MiB\n",
            b / 1e6 / w, w, b / 1e6 / (u + s), u + s, r / 1024 }'
    rm -f "$log" "$log.out"
}
