#!/usr/bin/env bash
# The 1 GiB cell (ckptio, torch) before/after, alternated three times.
OUT=/work/ba/load-ab; mkdir -p $OUT
for i in 1 2 3; do for side in before after; do
  d=/work/wt/before; [ $side = after ] && d=/work/main
  ( cd $d && timeout 400 .venv/bin/python bench/run.py --dir /work/ba-dir --tensor-sizes 1G --model none --mechanisms torch,ckptio --runs 3 --no-warm --out $OUT/$side-$i --quiet > $OUT/$side-$i.log 2>&1 )
  rm -rf /work/ba-dir
done; done
echo done
