#!/usr/bin/env bash
# Before (c401704, /work/wt/before) and after (/work/main) alternated, same machine, same minutes.
set -u
OUT=${OUT:-/work/ba2}
mkdir -p $OUT
B=/work/wt/before A=/work/main
uptime > $OUT/uptime-start.txt
for i in 1 2 3; do
  for side in before after; do
    d=$B; [ $side = after ] && d=$A
    ( cd $d && timeout 600 build/tools/ckptio bench --dir /work/ba-dir --size 2G --runs 1 --json > $OUT/ckptio-bench-2G-$side-$i.json 2> $OUT/ckptio-bench-2G-$side-$i.err )
    rm -rf /work/ba-dir
  done
done
for side in before after; do
  d=$B; [ $side = after ] && d=$A
  ( cd $d && timeout 900 .venv/bin/python bench/run.py --dir /work/ba-dir --tensor-sizes 1G --model 350m --mechanisms torch,safetensors,ckptio --runs 3 --model-runs 2 --out $OUT/run-$side --quiet > $OUT/run-$side.log 2>&1 )
  rm -rf /work/ba-dir
done
for side in before after; do
  d=$B; [ $side = after ] && d=$A
  ( cd $d && timeout 900 .venv/bin/python bench/multirank.py --dir /work/ba-dir --rounds 2 --mechanisms ckptio,dcp --out $OUT/multirank-$side --quiet > $OUT/multirank-$side.log 2>&1 )
  rm -rf /work/ba-dir
done
for i in 1 2 3; do for side in before after; do
  d=$B; [ $side = after ] && d=$A
  ( cd $d && timeout 400 .venv/bin/python bench/run.py --dir /work/ba-dir --tensor-sizes 1G --model none --mechanisms torch,ckptio --runs 3 --no-warm --out $OUT/load-1g-$side-$i --quiet > $OUT/load-1g-$side-$i.log 2>&1 )
  rm -rf /work/ba-dir
done; done
uptime > $OUT/uptime-end.txt
echo finished > $OUT/DONE
