#!/usr/bin/env bash
# ckptio convert before (c401704) and after (main), alternated: a 1 GiB checkpoint of 64 x 16 MiB
# tensors (and 256 small ones) to one safetensors file and back; source warm in the page cache.
set -u
D=/work/cv; OUT=${OUT:-/work/ba2/convert}; mkdir -p $OUT
/work/main/.venv/bin/python - <<'PY'
import numpy as np, ckptio
rng = np.random.default_rng(0)
t = {f"big{i}": rng.standard_normal(4 << 20, dtype=np.float32) for i in range(64)}
t.update({f"small{i}": rng.standard_normal(1000, dtype=np.float32) for i in range(256)})
ckptio.save(t, "/work/cv/src", overwrite=True)
PY
cat /work/cv/src/data/* > /dev/null
for i in 1 2 3; do for side in before after; do
  b=/work/wt/before/build/tools/ckptio; [ $side = after ] && b=/work/main/build/tools/ckptio
  rm -rf $D/out.safetensors $D/back
  s=$(date +%s.%N); $b convert $D/src $D/out.safetensors >/dev/null 2>&1 || echo FAIL; m=$(date +%s.%N)
  $b convert $D/out.safetensors $D/back >/dev/null 2>&1 || echo FAIL; e=$(date +%s.%N)
  python3 -c "print('{\"side\":\"$side\",\"round\":$i,\"to_safetensors_s\":%.3f,\"back_to_ckptio_s\":%.3f}' % ($m-$s, $e-$m))" | tee -a $OUT/convert-ab.jsonl
done; done
