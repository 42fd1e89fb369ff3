"""A hostile entry against `show`, `load_entry`, `validate` and `fetch` (issue 46, items 1 to 6 and 9):
nothing outside the entry is read or printed, nothing hangs or allocates past what its weights hold,
no file an entry names is opened before it is refused, and fetching follows the first URL's rules."""
from __future__ import annotations

import hashlib
import http.server
import json
import os
import shutil
import threading
import time
from pathlib import Path

import pytest

from tests.helpers import cli, one_line_error
from tests.leaderboard.helpers import entry_path
from tmem_bench import load_entry
from tmem_bench.errors import UsageError
from tmem_bench.leaderboard import cache, validate, weights
from tmem_bench.leaderboard.weights import FetchError, download, weights_cache

SECRET = "SECRET-CONTENT-OF-ANOTHER-FILE"


@pytest.fixture(autouse=True)
def _own_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("TMEM_BENCH_CACHE", str(tmp_path / "cache"))


def _outside(tmp_path: Path) -> Path:
    secret = tmp_path / "outside" / "secret.json"
    secret.parent.mkdir()
    secret.write_text(json.dumps([SECRET]))
    return secret


def _first_cell(entry_dir: Path) -> Path:
    return entry_dir / "cells" / f"{json.loads((entry_dir / 'entry.json').read_text())['cells'][0]}.json"


def test_show_and_load_entry_read_nothing_through_a_link_or_outside_the_entry(board, tmp_path, capsys):
    entry_dir = entry_path(board)
    secret = _outside(tmp_path)
    cell = _first_cell(entry_dir)
    cell.unlink()
    cell.symlink_to(secret)
    code, out, err = cli(["leaderboard", "show", entry_dir], capsys)
    one_line_error(code, err, "is a symbolic link")
    assert SECRET not in out + err

    cell.unlink()
    entry = json.loads((entry_dir / "entry.json").read_text())
    entry["cells"][0] = os.path.relpath(secret.with_suffix(""), entry_dir / "cells")  # ../../../outside/secret
    (entry_dir / "entry.json").write_text(json.dumps(entry))
    code, out, err = cli(["leaderboard", "show", entry_dir], capsys)
    one_line_error(code, err, "which is not a cell id")
    assert SECRET not in out + err
    with pytest.raises(UsageError, match="not a cell id") as caught:
        load_entry(entry_dir)
    assert SECRET not in str(caught.value)

    (entry_dir / "entry.json").unlink()
    (entry_dir / "entry.json").symlink_to(secret)
    with pytest.raises(UsageError, match="entry.json is a symbolic link") as caught:
        load_entry(entry_dir)
    assert SECRET not in str(caught.value)


def test_show_refuses_a_fifo_in_place_of_a_cell_file_without_opening_it(board, capsys):
    entry_dir = entry_path(board)
    cell = _first_cell(entry_dir)
    cell.unlink()
    os.mkfifo(cell)
    found = []
    reader = threading.Thread(target=lambda: found.append(cli(["leaderboard", "show", entry_dir], capsys)),
                              daemon=True)
    reader.start()
    reader.join(timeout=60)
    if reader.is_alive():
        with open(cell, "w"):  # opening the other end releases the hung reader, so that the run can go on
            pass
        pytest.fail("show opened the FIFO and blocked on it")
    code, _, err = found[0]
    one_line_error(code, err, "is not a regular file")


def test_load_entry_refuses_huge_files_and_cells_whose_options_cannot_build_a_model(board):
    entry_dir = entry_path(board)
    cell = _first_cell(entry_dir)
    original = cell.read_text()
    with open(cell, "r+b") as f:
        f.truncate(3 << 30)  # sparse: 3 GB to read, nothing on disk
    with pytest.raises(UsageError, match=r"is 3,221,225,472 bytes; an entry's file is read up to"):
        load_entry(entry_dir)

    result = json.loads(original)
    del result["cell"]["model_options"]["d_model"]
    cell.write_text(json.dumps(result))
    with pytest.raises(UsageError, match=r"model_options.d_model is None, not a positive integer"):
        load_entry(entry_dir)

    result["cell"]["model_options"].update(d_model=2**20, n_layers=64)
    cell.write_text(json.dumps(result))
    loaded = load_entry(entry_dir)
    started = time.perf_counter()
    with pytest.raises(UsageError, match=r"bytes of parameters, more than its [0-9,]+-byte weights file holds"):
        loaded.model(result["cell_id"])
    assert time.perf_counter() - started < 30  # measured on the meta device, nothing allocated


def test_validate_opens_no_file_an_entry_names_as_a_path(board, tmp_path, monkeypatch):
    evil = tmp_path / "evil"
    evil.mkdir()
    (evil / "evilmod.py").write_text("raise SystemExit('imported')\n")
    entry_dir = entry_path(board)
    entry = json.loads((entry_dir / "entry.json").read_text())
    entry["model"]["name"] = f"{evil}/evilmod:x"
    (entry_dir / "entry.json").write_text(json.dumps(entry))
    opened, real = [], cache._file_digest
    monkeypatch.setattr(cache, "_file_digest", lambda path: opened.append(Path(path)) or real(path))
    found = validate(board, allow_module_names=True).rejections
    assert not [p for p in opened if p.is_relative_to(evil)], opened
    assert any("tiny-base: model.name: model" in line and "is not a module:attribute name" in line
               for line in found), found


# Fetching: a real HTTP server on 127.0.0.1 whose paths misbehave on purpose.

class _Hostile(http.server.BaseHTTPRequestHandler):
    body = b"weights " * 64

    def do_GET(self):  # noqa: N802 - the standard library's name
        if self.path == "/loop":
            self._redirect("/loop")
        elif self.path == "/away":
            self._redirect("http://example.org/w.safetensors")
        elif self.path == "/slow":
            self.send_response(200)
            self.send_header("Content-Length", str(len(self.body)))
            self.end_headers()
            try:
                for byte in self.body:  # one byte at a time, each well within the per-read limit
                    self.wfile.write(bytes([byte]))
                    self.wfile.flush()
                    time.sleep(0.05)
            except (BrokenPipeError, ConnectionResetError):
                pass  # the client gave up at its deadline, as it should
        else:
            self.send_error(404)

    def _redirect(self, where: str):
        self.send_response(302)
        self.send_header("Location", where)
        self.end_headers()

    def log_message(self, *args):
        pass


@pytest.fixture
def hostile():
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Hostile)
    httpd.daemon_threads = True
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}"
    httpd.shutdown()
    httpd.server_close()


def _record(data: bytes) -> dict:
    return {"sha256": hashlib.sha256(data).hexdigest(), "size": len(data)}


def test_a_download_has_an_overall_deadline(hostile, monkeypatch):
    assert weights.deadline_s(1 << 30) == pytest.approx(60 + (1 << 30) / 100_000)  # what docs/leaderboard.md says
    monkeypatch.setattr(weights, "DEADLINE_BASE_S", 1)
    started = time.perf_counter()
    with pytest.raises(FetchError, match=r"/slow took longer than 1 s, the limit for 512 bytes .*not kept"):
        download(f"{hostile}/slow", weights_cache() / "slow", _record(_Hostile.body))
    assert time.perf_counter() - started < 10


def test_redirects_keep_the_first_urls_rules_and_a_loop_is_one_line(hostile):
    record = _record(b"x")
    with pytest.raises(FetchError, match=r"/away: .*'http://example.org/w.safetensors' is not a weights address.*"
                                         r"not followed"):
        download(f"{hostile}/away", weights_cache() / "away", record)
    with pytest.raises(FetchError) as caught:
        download(f"{hostile}/loop", weights_cache() / "loop", record)
    assert str(caught.value) == f"{hostile}/loop: redirects in a loop or more than 10 times (HTTP 302)"


def test_fetch_reads_an_entrys_file_url_only_when_told(board, capsys):
    entry_dir = entry_path(board)
    entry = json.loads((entry_dir / "entry.json").read_text())
    cell_id = entry["cells"][0]
    held = entry_dir / "cells" / f"{cell_id}.safetensors"
    published = board.parent / "published.safetensors"
    shutil.move(held, published)
    entry["weights"][cell_id]["url"] = published.as_uri()
    (entry_dir / "entry.json").write_text(json.dumps(entry))
    code, out, err = cli(["leaderboard", "fetch", board], capsys)
    assert code == 1 and "its URL is a file:// URL, which reads a file of this machine: not read" in err, err
    assert entry["weights"][cell_id]["sha256"][:12] not in out + err  # nothing of the file is told
    code, out, err = cli(["leaderboard", "fetch", board, "--allow-file-urls"], capsys)
    assert code == 0 and "tiny-base: 1 fetched, 0 in the cache" in out, out + err


def test_validate_builds_nothing_for_the_causality_probe_from_a_model_it_refused(board, monkeypatch):
    """The probe rebuilt each model before re-evaluation had bounded its size by its weights file: an
    entry whose options name d_model 2**20 had the probe allocate it. Now a refusal comes first."""
    import importlib

    from tmem_bench.leaderboard import reeval
    validate_module = importlib.import_module("tmem_bench.leaderboard.validate")

    def refuse(cell, weights):
        raise ValueError("the cell's options make a model of 17,592,186,044,416 bytes of parameters")

    probed = []
    monkeypatch.setattr(reeval, "build_within", refuse)
    monkeypatch.setattr(validate_module, "_probe_again", lambda *a: probed.append(a))
    found = validate(board).rejections
    assert any("bytes of parameters" in line for line in found), found
    assert not probed
