# SPDX-License-Identifier: Apache-2.0
"""Prefix spreading on the object stores (doc/s3.md, "At scale"): a save with the store setting
prefix_spread = n puts its data objects under <parent>/.ckptio-<n hex digits>/<name>/ rather
than under the checkpoint's own key, and says so in the manifest, so loads take no setting.
Tested on both S3 servers and on GCS, in this process: where the objects go, loads and opens
without the setting, overwrite and removal (the Manager's retention) leaving nothing behind,
what a killed spread save left found by its marker and removed by the next save, a sweep and a
removal, the setting's refusals, and the names it reserves. Nothing leaves 127.0.0.1."""

from __future__ import annotations

import re
import time
from typing import Any

import numpy as np
import pytest
from faultproxy import FaultProxy, Rule
from gcsservers import GCSServer, download, list_names, upload
from s3servers import S3Server, list_keys, open_uploads, unique_prefix

import ckptio

pytest_plugins = ["gcsservers", "s3servers"]

MiB = 1 << 20
# "<name>/d-<clock>-<random>-x<n>/<file>" past "<parent>/.ckptio-<h>/"
SPREAD = re.compile(r"^\.ckptio-([0-9a-f]+)/([^/]+)/(d-[0-9a-f]+-[0-9a-f]{16}-x([12]))/(.+)$")


def tree(seed: int, big: int = 12 * MiB) -> dict[str, Any]:
    rng = np.random.default_rng(seed)
    return {"w": rng.standard_normal(big // 4, dtype=np.float32), "b": np.arange(5, dtype=np.int64) + seed,
            "step": seed}  # fmt: skip


def same(a: dict[str, Any], b: dict[str, Any]) -> bool:
    return a.keys() == b.keys() and all(np.array_equal(np.asarray(a[k]), np.asarray(b[k])) for k in a)


class Bucket:
    """The names under a prefix of either store's test bucket, and a way to leave objects there
    as a killed save would."""

    def __init__(self, srv: S3Server | GCSServer) -> None:
        self.srv = srv
        self.s3 = isinstance(srv, S3Server)

    def url(self, key: str) -> str:
        return f"{'s3' if self.s3 else 'gs'}://{self.srv.bucket}/{key}"

    def names(self, prefix: str) -> list[str]:
        """The keys under ``prefix/``, relative to it."""
        keys = list_keys(self.srv.client(), self.srv.bucket, prefix + "/") if self.s3 else list_names(self.srv, prefix + "/")
        return sorted(k[len(prefix) + 1 :] for k in keys)

    def put(self, key: str, data: bytes = b"x") -> None:
        if self.s3:
            self.srv.client().put_object(Bucket=self.srv.bucket, Key=key, Body=data)
        else:
            upload(self.srv, key, data)

    def rewrite(self, key: str) -> None:
        """Write the object ``key`` again, the same bytes: as a commit whose sweep never ran."""
        if self.s3:
            self.put(key, self.srv.client().get_object(Bucket=self.srv.bucket, Key=key)["Body"].read())
        else:
            self.put(key, download(self.srv, key))

    def uploads(self, prefix: str) -> list[str]:
        return open_uploads(self.srv.client(), self.srv.bucket, prefix + "/") if self.s3 else []


def spread_of(names: list[str]) -> dict[str, list[tuple[str, str, str]]]:
    """The spread data objects among ``names`` (relative to the parent): checkpoint name ->
    [(h, data component, file)]."""
    out: dict[str, list[tuple[str, str, str]]] = {}
    for n in names:
        m = SPREAD.match(n)
        if m:
            assert len(m.group(1)) == int(m.group(4)), n  # n hex digits for -x<n>
            out.setdefault(m.group(2), []).append((m.group(1), m.group(3), m.group(5)))
    return out


@pytest.fixture(params=["seaweedfs", "moto", "fake-gcs-server"])
def store(request: Any, monkeypatch: pytest.MonkeyPatch) -> tuple[Bucket, str]:
    """Each server (shared for the session) with its environment set, and a fresh prefix."""
    srv = request.getfixturevalue(request.param.replace("-", "_") + ("" if "gcs" in request.param else "_server"))
    for k, v in srv.env.items():
        monkeypatch.setenv(k, v)
    return Bucket(srv), unique_prefix(request.node.name)


def test_where_the_objects_go_and_back(store: tuple[Bucket, str]) -> None:
    """A spread save's data lies under <parent>/.ckptio-<hh>/<name>/ and nothing but its
    manifest and marker under <name>/; it loads, opens and lists with no setting; an
    overwrite with one digit replaces it and removes every object of the old one; a removal
    leaves nothing."""
    b, prefix = store
    url = b.url(f"{prefix}/step-1")
    ckptio.save(tree(1), url, storage_options={"prefix_spread": "2"})
    names = b.names(prefix)
    mine = [n for n in names if n.startswith("step-1/")]
    assert len(mine) == 2 and "step-1/manifest" in mine, names
    (marker,) = [n for n in mine if n != "step-1/manifest"]
    comp = marker.split("/")[1]
    assert marker == f"step-1/{comp}/spread" and comp.endswith("-x2"), marker
    data = spread_of(names)
    assert list(data) == ["step-1"] and {c for _h, c, _f in data["step-1"]} == {comp}, names
    assert same(ckptio.load(url), tree(1))
    with ckptio.open(url) as r:
        assert np.array_equal(np.asarray(r["b"]), tree(1)["b"])
    assert ckptio._core.list_checkpoints(b.url(prefix)) == ["step-1"]

    ckptio.save(tree(2), url, overwrite=True, storage_options={"prefix_spread": 1})
    assert same(ckptio.load(url), tree(2))
    names = b.names(prefix)
    data = spread_of(names)
    assert [len(h) for h, _c, _f in data["step-1"]] and all(len(h) == 1 for h, _c, _f in data["step-1"]), names
    assert comp not in "".join(names), f"the replaced save's objects are gone: {names}"
    assert len([n for n in names if n.startswith("step-1/")]) == 2, names

    ckptio._core.remove_checkpoint(url)
    assert b.names(prefix) == [] and b.uploads(prefix) == []


def test_manager_retention_removes_spread_steps(store: tuple[Bucket, str]) -> None:
    """A Manager saving with prefix_spread keeps two steps: the others' spread data is gone."""
    b, prefix = store
    m = ckptio.Manager(b.url(prefix), keep=2, async_save=False, storage_options={"prefix_spread": "2"})
    for step in (1, 2, 3, 4):
        m.save(step, tree(step, MiB))
    assert m.all_steps() == [3, 4]
    assert same(m.restore(), tree(4, MiB))
    m.close()
    names = b.names(prefix)
    assert sorted(spread_of(names)) == ["3", "4"], names
    assert sorted({n.split("/")[0] for n in names if not n.startswith(".ckptio-")}) == ["3", "4"], names


def test_what_a_killed_spread_save_left_is_swept(store: tuple[Bucket, str]) -> None:
    """Objects and an open upload of spread saves that died (their markers, and data in two
    spread prefixes) are removed: by the next save of the path that commits, by a sweep of the
    parent (after a commit whose own sweep never ran), and by the removal of the checkpoint."""
    b, prefix = store

    def leave_dead_save(name: str, n: int) -> str:
        comp = f"d-{int(time.time()) - 60:x}-{np.random.default_rng().integers(1 << 63):016x}-x{n}"
        b.put(f"{prefix}/{name}/{comp}/spread", b"")
        for h in ("0" * n, "f" * n):
            b.put(f"{prefix}/.ckptio-{h}/{name}/{comp}/r00003-000000.ckd")
        if b.s3:
            b.srv.client().create_multipart_upload(Bucket=b.srv.bucket, Key=f"{prefix}/.ckptio-{'7' * n}/{name}/{comp}/r00004-000000.ckd")  # fmt: skip
        return comp

    url = b.url(f"{prefix}/a")
    ckptio.save(tree(1, MiB), url, storage_options={"prefix_spread": "1"})
    dead = leave_dead_save("a", 2)
    time.sleep(2.1)  # the sweep spares what a save begun after the committing one left
    ckptio.save(tree(2, MiB), url, overwrite=True, storage_options={"prefix_spread": "2"})
    names = b.names(prefix)
    assert dead not in "".join(names) and b.uploads(prefix) == [], names
    assert len({c for _h, c, _f in spread_of(names)["a"]}) == 1, names

    dead = leave_dead_save("a", 1)
    time.sleep(2.1)
    b.rewrite(f"{prefix}/a/manifest")  # a commit after the dead save began, whose sweep never ran
    assert ckptio._core.sweep(b.url(prefix)) >= 3
    assert dead not in "".join(b.names(prefix)) and b.uploads(prefix) == []
    assert same(ckptio.load(url), tree(2, MiB))

    dead = leave_dead_save("a", 2)
    ckptio._core.remove_checkpoint(url)
    assert b.names(prefix) == [] and b.uploads(prefix) == []


def test_refusals(store: tuple[Bucket, str], monkeypatch: pytest.MonkeyPatch) -> None:
    """A value other than 0, 1 or 2 is refused when set and from the environment, naming
    where it came from; a checkpoint may not be named like a spread prefix; 0 spreads
    nothing."""
    b, prefix = store
    url = b.url(f"{prefix}/a")
    with pytest.raises(ckptio.CheckpointError, match=r"prefix_spread is '3': use 0 \(off\), 1 \(16 prefixes\) or 2"):
        ckptio.save(tree(1, MiB), url, storage_options={"prefix_spread": "3"})
    monkeypatch.setenv("CKPTIO_PREFIX_SPREAD", "yes")
    with pytest.raises(ckptio.CheckpointError, match=r"CKPTIO_PREFIX_SPREAD is 'yes'"):
        ckptio.save(tree(1, MiB), url)
    monkeypatch.setenv("CKPTIO_PREFIX_SPREAD", "0")
    ckptio.save(tree(1, MiB), url)
    assert not spread_of(b.names(prefix)) and same(ckptio.load(url), tree(1, MiB))
    with pytest.raises(ckptio.CheckpointError, match="names starting with '.ckptio-' hold the data"):
        ckptio.save(tree(1, MiB), b.url(f"{prefix}/.ckptio-0a"))


def test_data_that_would_not_go_keeps_its_marker(store: tuple[Bucket, str], monkeypatch: pytest.MonkeyPatch) -> None:
    """Deletions of spread objects refused (503 until a 2 s deadline, through a proxy): an
    overwrite still commits and keeps the replaced save's marker beside what it could not
    delete, and a removal fails saying so; a later save of the path, the store answering
    again, removes all of it."""
    b, prefix = store
    kind = "S3" if b.s3 else "GCS"
    monkeypatch.setenv(f"CKPTIO_{kind}_TIMEOUT", "2")
    url = b.url(f"{prefix}/a")
    with FaultProxy(b.srv.endpoint) as proxy:
        so = {"endpoint_url": proxy.endpoint, "prefix_spread": "1", **({} if b.s3 else {"token": "test"})}
        ckptio.save(tree(1, MiB), url, storage_options=so)
        first = b.names(prefix)
        (old,) = {c for _h, c, _f in spread_of(first)["a"]}
        proxy.add(Rule("503", "DELETE", ".ckptio-"))
        ckptio.save(tree(2, MiB), url, overwrite=True, storage_options=so)
        names = b.names(prefix)
        assert f"a/{old}/spread" in names and [n for n in first if SPREAD.match(n)][0] in names, names
        with pytest.raises(ckptio.CheckpointError):
            ckptio._core.remove_checkpoint(url, ckptio._options.store(so))
        assert not ckptio._core.is_checkpoint(url)
        left = b.names(prefix)
        assert len({c for _h, c, _f in spread_of(left)["a"]}) == 2 and len([n for n in left if n.endswith("/spread")]) == 2, left
        proxy.clear()
        time.sleep(2.1)
        ckptio.save(tree(3, MiB), url, storage_options=so)
    names = b.names(prefix)
    assert len({c for _h, c, _f in spread_of(names)["a"]}) == 1 and len([n for n in names if n.endswith("/spread")]) == 1, names
    assert same(ckptio.load(url), tree(3, MiB))
