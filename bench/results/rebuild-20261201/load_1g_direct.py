import sys, time, os, numpy as np, ckptio, json
d = sys.argv[1]; mode = sys.argv[2]
if mode == "save":
    ckptio.save({"w": np.random.default_rng(0).integers(0, 255, 1 << 30, dtype=np.uint8)}, d, overwrite=True)
    sys.exit()
for f in os.listdir(os.path.join(d, "data")):
    fd = os.open(os.path.join(d, "data", f), os.O_RDONLY); os.fsync(fd); os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED); os.close(fd)
t = time.perf_counter(); x = ckptio.load(d); t = time.perf_counter() - t
print(json.dumps({"gbps": (1 << 30) / t / 1e9}))
