import sys, time, os, numpy as np, ckptio, json
d = sys.argv[1]; mode = sys.argv[2]
if mode == "save":
    ckptio.save({"w": np.random.default_rng(0).integers(0, 255, 1 << 30, dtype=np.uint8)}, d, overwrite=True)
    sys.exit()
dst = {"w": np.empty(1 << 30, np.uint8)}
dst["w"][::4096] = 1  # faulted in: into= reads in place
for f in os.listdir(os.path.join(d, "data")):
    fd = os.open(os.path.join(d, "data", f), os.O_RDONLY); os.fsync(fd); os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED); os.close(fd)
t = time.perf_counter(); ckptio.load(d, into=dst); t = time.perf_counter() - t
print(json.dumps({"mode": mode, "gbps": round((1 << 30) / t / 1e9, 3)}))
