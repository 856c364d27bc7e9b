#!/bin/bash
# ncu (Nsight Compute) of one kernel launch per library build, on a GPU machine:
# the key metrics, pipe use, stall reasons per issue, stall samples by opcode and
# the SASS lines that hold the most stall samples. Drives cuda_ab.py (one shape,
# one round) under ncu --set full --clock-control none; reports go to $OUT.
#   OUT=dir [KREGEX=kivi_decode] [KSKIP=3] bench/scripts/cuda_ncu.sh SHAPE LIB...
# SHAPE as cuda_ab.py's --shape (spec,batch,seq[,q heads]); KREGEX picks the
# kernel (e.g. append_kernel), KSKIP how many of its launches to skip first.
OUT=${OUT:-$PWD/cuda_ncu_out}
mkdir -p "$OUT"
here=$(cd "$(dirname "$0")" && pwd)
NCU=$(command -v ncu || ls /usr/local/cuda/bin/ncu /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
[ -z "$NCU" ] && { echo "no ncu on this machine"; exit 1; }
shape=$1; shift
for lib in "$@"; do
  name=$(basename "$lib" .so)
  rep=$OUT/ncu_$name
  $NCU --clock-control none --set full --import-source yes -k regex:${KREGEX:-kivi_decode} -s ${KSKIP:-3} -c 1 -f -o $rep \
    python3 "$here/cuda_ab.py" --lib "x=$lib" --shape "$shape" --rounds 1 > "$rep.log" 2>&1 || { tail -5 "$rep.log"; continue; }
  $NCU -i $rep.ncu-rep --page raw --csv > $rep.raw.csv
  $NCU -i $rep.ncu-rep --page source --csv --print-source sass > $rep.src.csv 2>/dev/null
  echo "== $lib $shape"
  python3 "$here/ncu_summary.py" "$rep.raw.csv" "$rep.src.csv"
done
