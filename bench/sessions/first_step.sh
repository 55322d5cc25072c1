# Sourced by gpu7.sh, gpu8.sh and gpu34.sh: `launch NAME CACHEDIR MODE [BUDGET]` runs one fresh bench.run
# process of HF Qwen2-0.5B (B8, T1024) into $R/first/NAME, with its own cache folders under
# /tmp/caches/CACHEDIR, within what is left of LIMIT seconds since T0.
T0=$(date +%s)
left() { local s=$(( ${LIMIT:-560} - ($(date +%s) - T0) )); echo $(( s > 1 ? s : 1 )); }
launch() {  # name cachedir mode [budget]
  local name=$1 dir=$2 mode=$3 budget=${4:-}
  mkdir -p $R/first/$name
  env TORCHINDUCTOR_CACHE_DIR=/tmp/caches/$dir/inductor COLAUTO_CACHE_DIR=/tmp/caches/$dir/colauto \
      ${budget:+COLAUTO_MEMORY_BUDGET=$budget} COLAUTO_REPORT=1 \
      timeout -k 5 $(left) python -m bench.run --models hf/qwen2:bench:8:1024 --modes $mode --steps 3 --warmup 1 \
      --out $R/first/$name > $R/first/$name/log.txt 2>&1
  rm -f $R/first/$name/*.png
}
