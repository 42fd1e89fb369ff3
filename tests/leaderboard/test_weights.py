"""Weights by hash: recorded in the entry, held or referenced, fetched over a real HTTP server, and verified."""
from __future__ import annotations

import functools
import hashlib
import http.server
import json
import shutil
import sys
import threading
import types
from pathlib import Path

import pytest

from tests.helpers import empty_board
from tests.leaderboard.helpers import tiny_run
from tmem_bench.cli import main
from tmem_bench.errors import UsageError
from tmem_bench.leaderboard import validate
from tmem_bench.leaderboard.weights import (FetchError, check_url, download, fetch, locate, metadata, record,
                                            weights_cache)


@pytest.fixture(autouse=True)
def _own_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("TMEM_BENCH_CACHE", str(tmp_path / "cache"))


@pytest.fixture
def server(tmp_path):
    """A real HTTP server on 127.0.0.1 serving tmp_path/served; yields (folder, base URL)."""
    served = tmp_path / "served"
    served.mkdir()
    handler = functools.partial(_Quiet, directory=str(served))
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield served, f"http://127.0.0.1:{httpd.server_address[1]}"
    httpd.shutdown()
    httpd.server_close()


class _Quiet(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args):
        pass


def _file(folder: Path, name: str, data: bytes) -> dict:
    (folder / name).write_bytes(data)
    return {"sha256": hashlib.sha256(data).hexdigest(), "size": len(data)}


def test_a_download_is_kept_only_with_the_recorded_hash_and_size(server, tmp_path):
    served, base = server
    good = _file(served, "w.safetensors", b"weights " * 1000)
    target = weights_cache() / good["sha256"]
    download(f"{base}/w.safetensors", target, good)
    assert target.read_bytes() == b"weights " * 1000

    forged = {**good, "sha256": hashlib.sha256(b"other bytes").hexdigest()}
    with pytest.raises(FetchError, match="gives sha256 .* the entry records .*not kept"):
        download(f"{base}/w.safetensors", weights_cache() / forged["sha256"], forged)
    with pytest.raises(FetchError, match="more than the recorded 100 bytes"):
        download(f"{base}/w.safetensors", weights_cache() / "short", {**good, "size": 100})
    with pytest.raises(FetchError, match=r"/missing.safetensors: HTTP Error 404"):
        download(f"{base}/missing.safetensors", weights_cache() / "x", good)
    assert sorted(p.name for p in weights_cache().iterdir()) == [good["sha256"]]  # nothing half-written kept


def test_only_https_file_and_hf_urls_and_http_to_this_machine(tmp_path):
    for url in ("https://example.org/w", "file:///data/w.safetensors", "hf://owner/repo/w.safetensors",
                "http://127.0.0.1:8000/w", "http://localhost/w"):
        check_url(url, "url")
    for url in ("http://example.org/w", "ftp://example.org/w", "/data/w.safetensors", "https://"):
        with pytest.raises(UsageError, match="use https://, file:// or hf://"):
            check_url(url, "url")
    data = _file(tmp_path, "w.bin", b"abc" * 10)
    download((tmp_path / "w.bin").as_uri(), weights_cache() / data["sha256"], data)
    assert (weights_cache() / data["sha256"]).read_bytes() == b"abc" * 10


def test_hf_urls_go_through_huggingface_hub_and_are_verified_too(tmp_path, monkeypatch):
    data = _file(tmp_path, "w.bin", b"hub bytes")
    monkeypatch.setitem(sys.modules, "huggingface_hub", None)  # not installed
    with pytest.raises(UsageError, match=r"hf:// weights need huggingface_hub; .*tmem-bench\[hf\]"):
        download("hf://owner/repo/w.bin", weights_cache() / data["sha256"], data)
    calls = []

    def hf_hub_download(**kwargs):
        calls.append(kwargs)
        return str(tmp_path / "w.bin")

    monkeypatch.setitem(sys.modules, "huggingface_hub", types.SimpleNamespace(hf_hub_download=hf_hub_download))
    download("hf://datasets/owner/repo@v1/cells/w.bin", weights_cache() / data["sha256"], data)
    assert calls == [{"repo_id": "owner/repo", "filename": "cells/w.bin", "revision": "v1", "repo_type": "dataset"}]
    with pytest.raises(FetchError, match="gives sha256"):
        download("hf://owner/repo/w.bin", weights_cache() / "x", {**data, "sha256": "0" * 64})


@pytest.fixture(scope="module")
def pristine(tmp_path_factory) -> Path:
    """A board with one entry (base on no_harm, three seeds) submitted from a real run."""
    folder = tmp_path_factory.mktemp("weights")
    run_dir = tiny_run(folder, "no_harm", "--models", "base")
    board = empty_board(folder)
    assert main(["leaderboard", "submit", str(run_dir), "--name", "Held", "--leaderboard", str(board)]) == 0
    return board


@pytest.fixture
def board(pristine, tmp_path) -> Path:
    shutil.copytree(pristine, tmp_path / "leaderboard")
    return tmp_path / "leaderboard"


def _entry(board: Path) -> tuple[Path, dict]:
    path = board / "entries" / "held"
    return path, json.loads((path / "entry.json").read_text())


def test_a_submitted_entry_records_its_weights_and_each_file_names_its_model(board):
    path, entry = _entry(board)
    assert sorted(entry["weights"]) == sorted(entry["cells"])
    for cell_id, recorded in entry["weights"].items():
        weights = path / "cells" / f"{cell_id}.safetensors"
        assert recorded == record(weights) and "url" not in recorded
        about = metadata(weights)
        cell = json.loads((path / "cells" / f"{cell_id}.json").read_text())
        assert about["cell_id"] == cell_id and about["model"] == "base"
        assert json.loads(about["cell"]) == cell["cell"] and about["tmem_bench_version"] == cell["tmem_bench_version"]
        assert json.loads(about["model_config"]) == cell["model_config"]


def test_held_weights_other_than_recorded_are_rejected(board):
    path, entry = _entry(board)
    first, second = (path / "cells" / f"{cell_id}.safetensors" for cell_id in entry["cells"][:2])
    size = first.stat().st_size
    first.write_bytes(first.read_bytes() + b" ")
    data = bytearray(second.read_bytes())
    data[-1] ^= 1  # one bit of the last tensor: the same size, another hash
    second.write_bytes(bytes(data))
    found = validate(board).rejections
    assert f"held: weights: weights file cells/{first.name} is {size + 1:,} bytes; the entry records {size:,}" in found
    assert any(f"held: weights: weights file cells/{second.name} has sha256" in line and "the entry records" in line
               for line in found), found


def _reference(board: Path, base: str, served: Path) -> dict:
    """Publish the entry's weights under `served` and make the entry reference them at `base`."""
    path, entry = _entry(board)
    for cell_id in entry["cells"]:
        held = path / "cells" / f"{cell_id}.safetensors"
        shutil.move(held, served / held.name)
        entry["weights"][cell_id]["url"] = f"{base}/{held.name}"
    (path / "entry.json").write_text(json.dumps(entry, indent=1, sort_keys=True) + "\n")
    return entry


def test_referenced_weights_are_fetched_verified_and_then_validate(board, server, capsys):
    served, base = server
    entry = _reference(board, base, served)
    first = validate(board)
    assert first.accepted == [] and len(first.rejections) == 1, first.rejections
    assert first.rejections[0].startswith("held: not re-evaluated: 3 of its 3 weights files are not here")

    forged = served / f"{entry['cells'][0]}.safetensors"
    honest = forged.read_bytes()
    forged.write_bytes(honest[:-1] + b"!")  # same size, another hash
    assert main(["leaderboard", "fetch", str(board)]) == 1
    err = capsys.readouterr().err
    assert f"{entry['cells'][0]}.safetensors: {base}/{forged.name} gives sha256" in err and "not kept" in err
    assert not (weights_cache() / entry["weights"][entry["cells"][0]]["sha256"]).exists()

    forged.write_bytes(honest)
    assert main(["leaderboard", "fetch", str(board)]) == 0
    assert "held: 1 fetched, 2 in the cache" in capsys.readouterr().out
    second = validate(board)
    assert [p.name for p, _ in second.accepted] == ["held"] and second.rejections == []
    path, _ = _entry(board)
    assert locate(path, entry, entry["cells"][0]) == weights_cache() / entry["weights"][entry["cells"][0]]["sha256"]
    assert not list(path.glob("cells/*.safetensors"))  # the entry holds none


def test_a_corrupted_cached_copy_is_not_trusted(board, server):
    served, base = server
    entry = _reference(board, base, served)
    assert main(["leaderboard", "fetch", str(board)]) == 0
    cached = weights_cache() / entry["weights"][entry["cells"][1]]["sha256"]
    cached.write_bytes(b"\0" * cached.stat().st_size)
    found = validate(board, full=True).rejections
    assert found and "not re-evaluated" in found[0] and "the cached copy is not the recorded file" in found[0]
    fetched, cached_before, failures = fetch(entry)
    assert (fetched, cached_before, failures) == (1, 2, [])  # fetch replaces it
    assert validate(board, full=True).rejections == []


def test_submit_with_weights_url_references_them_and_fetch_brings_them_back(pristine, server, tmp_path, capsys):
    served, base = server
    run_dir = pristine.parent / "run"
    board = empty_board(tmp_path / "referenced")
    assert main(["leaderboard", "submit", str(run_dir), "--name", "Referenced", "--leaderboard", str(board),
                 "--weights-url", "http://example.org/weights"]) == 2
    assert "--weights-url 'http://example.org/weights' is not a weights address" in capsys.readouterr().err
    assert main(["leaderboard", "submit", str(run_dir), "--name", "Referenced", "--leaderboard", str(board),
                 "--weights-url", f"{base}/run/"]) == 0
    entry_dir = board / "entries" / "referenced"
    entry = json.loads((entry_dir / "entry.json").read_text())
    assert not list(entry_dir.glob("cells/*.safetensors"))
    for cell_id, recorded in entry["weights"].items():
        assert recorded == record(run_dir / "cells" / f"{cell_id}.safetensors", f"{base}/run/{cell_id}.safetensors")
    shutil.copytree(run_dir / "cells", served / "run")  # what the submitter uploads
    assert main(["leaderboard", "fetch", str(board)]) == 0
    assert "referenced: 3 fetched, 0 in the cache" in capsys.readouterr().out
    assert main(["leaderboard", "validate", str(board)]) == 0

