"""An entry's weights by hash: held in its folder, or referenced by URL and fetched into a local cache.

An entry records each cell's weights file as {"sha256", "size"} and, when it does not hold the file
in cells/, the "url" it is published at (https://, file://, or hf:// through huggingface_hub).
`fetch` copies what an entry references into the cache, `weights_cache()/<sha256>`, reading at
most the recorded size and keeping a file only when its hash is the recorded one; validation reads
weights only through `locate`, which checks a held file's hash and size against the record too,
so a weights file is trusted for its hash alone, wherever it came from.
"""
from __future__ import annotations

import hashlib
import json
import os
import struct
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path
from urllib.parse import unquote, urlsplit

from ..errors import UsageError
from ..files import cache_root

MAX_WEIGHTS_BYTES = 1 << 30  # far above any cell's model; bounds what a hostile record can make us read
CHUNK = 1 << 20
SCHEMES = ("https://", "file://", "hf://")
LOOPBACK = ("127.0.0.1", "::1", "localhost")  # plain http:// only to this machine (a local mirror, the tests)
TIMEOUT_S = 60  # one read's limit; the whole download's is its deadline below
# A download's overall deadline: DEADLINE_BASE_S plus the recorded size at MIN_RATE bytes a second
# (a 6 MB cell: 2 minutes; the 1 GiB bound: 3 hours), so that a server trickling a byte a second
# cannot keep `fetch` running for ever.
DEADLINE_BASE_S = 60
MIN_RATE = 100_000


class Unreachable(Exception):
    """Weights an entry references that are neither held in its folder nor in the local cache."""


class FetchError(Exception):
    """A download that failed or did not give the recorded bytes; the message names the URL."""


def weights_cache() -> Path:
    return cache_root() / "weights"


def sha256_file(path: Path, limit: int = MAX_WEIGHTS_BYTES) -> tuple[str, int]:
    """(sha256, size) of a file read in chunks; ValueError past `limit` bytes."""
    digest, size = hashlib.sha256(), 0
    with open(path, "rb") as f:
        while chunk := f.read(CHUNK):
            size += len(chunk)
            if size > limit:
                raise ValueError(f"{path.name} is larger than {limit:,} bytes")
            digest.update(chunk)
    return digest.hexdigest(), size


def record(path: Path, url: str | None = None) -> dict:
    """The entry's record of one weights file: its hash and size, and where it is published."""
    digest, size = sha256_file(Path(path))
    return {"sha256": digest, "size": size, **({"url": url} if url else {})}


def records(weights_paths: dict[str, Path], base_url: str | None = None) -> dict[str, dict]:
    """The `weights` field of an entry: cell id -> its record; with `base_url`, each file is referenced
    at BASE_URL/<cell id>.safetensors (the run's own file names, so that its cells/ folder is what
    to upload) and the entry does not hold it."""
    if base_url is not None:
        check_url(base_url, "--weights-url")
    return {cell_id: record(path, f"{base_url.rstrip('/')}/{cell_id}.safetensors" if base_url else None)
            for cell_id, path in sorted(weights_paths.items())}


def check_url(url: str, what: str) -> None:
    """UsageError unless `url` has a scheme weights may be fetched from."""
    parts = urlsplit(url)
    if url.startswith(SCHEMES) and (parts.netloc or parts.path.strip("/")):
        return
    if parts.scheme == "http" and parts.hostname in LOOPBACK:
        return
    raise UsageError(f"{what} {url!r} is not a weights address: use https://, file:// or hf://OWNER/REPO/PATH "
                     f"(http:// only to {', '.join(LOOPBACK)})")


def record_problems(entry: dict) -> list[str]:
    """An entry's `weights` field, beyond its schema: when present, it records exactly the entry's cells."""
    recorded = entry.get("weights")
    if recorded is None:
        return []
    missing = sorted(set(entry["cells"]) - set(recorded))
    extra = sorted(set(recorded) - set(entry["cells"]))
    return ([f"records no weights for the cell {missing[0]} ({len(missing)} cells without)"] if missing else []) + (
        [f"records the weights of {extra[0]}, not a cell of the entry"] if extra else [])


def locate(entry_dir: Path, entry: dict, cell_id: str) -> Path:
    """The weights file of a cell to evaluate: held in the entry's folder, else the cached copy of
    the referenced file. ValueError when a file is not the one the entry records; Unreachable
    when referenced weights have not been fetched."""
    held = Path(entry_dir) / "cells" / f"{cell_id}.safetensors"
    expected = (entry.get("weights") or {}).get(cell_id)
    if expected is None:
        return held  # an entry from before weights were recorded: it holds them, and re-evaluation checks them
    problem = malformed(expected)
    if problem:
        raise ValueError(f"weights.{cell_id}: {problem}")
    if held.is_symlink() or (held.exists() and not held.is_file()):
        return held  # re-evaluation refuses it, unread
    if held.is_file() or "url" not in expected:
        _check(held, expected, f"cells/{held.name}")
        return held
    cached = weights_cache() / expected["sha256"]
    if not cached.is_file():
        raise Unreachable(f"cells/{held.name} is referenced at {expected['url']} and not in the cache {cached.parent}")
    try:
        _check(cached, expected, str(cached))
    except ValueError as e:
        raise Unreachable(f"the cached copy is not the recorded file ({e}); fetch it again") from None
    return cached


def _check(path: Path, expected: dict, name: str) -> None:
    if path.is_symlink() or not path.is_file():
        raise ValueError(f"weights file {name} is missing: the entry records it without a URL, so it must hold it")
    size = path.stat().st_size
    if size != expected["size"]:  # told before a byte is read, however large the file
        raise ValueError(f"weights file {name} is {size:,} bytes; the entry records {expected['size']:,}")
    digest, size = sha256_file(path, expected["size"])
    if digest != expected["sha256"]:
        raise ValueError(f"weights file {name} has sha256 {digest[:12]}...; the entry records "
                         f"{expected['sha256'][:12]}... ({size:,} bytes both)")


def metadata(path: Path) -> dict:
    """The string metadata of a safetensors file (its header's __metadata__), read without its tensors."""
    with open(path, "rb") as f:
        head = f.read(8)
        if len(head) != 8:
            raise ValueError(f"{path.name} is not a safetensors file (shorter than its header)")
        (length,) = struct.unpack("<Q", head)
        if length > 100_000_000:  # safetensors' own bound on a header
            raise ValueError(f"{path.name} is not a safetensors file (a header of {length:,} bytes)")
        try:
            header = json.loads(f.read(length))
        except (UnicodeDecodeError, json.JSONDecodeError):
            raise ValueError(f"{path.name} is not a safetensors file (its header is not JSON)") from None
    found = header.get("__metadata__") if isinstance(header, dict) else None
    return found if isinstance(found, dict) else {}


def metadata_mismatch(path: Path, result: dict) -> str | None:
    """What a weights file's own metadata says that its cell does not (None when they agree, or
    when the file predates the metadata: old weights name only their cell, or nothing)."""
    about = metadata(path)
    cell = result["cell"]
    claims = {"cell_id": result["cell_id"], "model": cell["model"], "tmem_bench_version": result.get("tmem_bench_version")}
    for key, actual in claims.items():
        if key in about and about[key] != actual:
            return f"its metadata names {key} {about[key]!r}, the cell {actual!r}"
    if "cell" in about and json.loads(about["cell"]) != cell:
        return "its metadata holds other cell settings than the cell file"
    return None


def malformed(expected) -> str | None:
    """What makes a weights record unusable (the schema's rules, checked again before a record names
    a file of the cache), or None."""
    if not isinstance(expected, dict) or not isinstance(expected.get("sha256"), str):
        return "the record has no sha256"
    if len(expected["sha256"]) != 64 or set(expected["sha256"]) - set("0123456789abcdef"):
        return f"sha256 {expected['sha256'][:70]!r} is not 64 hexadecimal digits"
    size = expected.get("size")
    if isinstance(size, bool) or not isinstance(size, int) or not 1 <= size <= MAX_WEIGHTS_BYTES:
        return f"size {size!r} is not a number of bytes from 1 to {MAX_WEIGHTS_BYTES:,}"
    if "url" in expected and not isinstance(expected["url"], str):
        return "its url is not a string"
    return None


def deadline_s(size: int) -> float:
    """How long downloading a file of `size` bytes may take in all."""
    return DEADLINE_BASE_S + size / MIN_RATE


def fetch(entry: dict, allow_file_urls: bool = False) -> tuple[int, int, list[str]]:
    """Download every referenced weights file of an entry that the cache lacks: (fetched, already
    cached, one line per failure). A file:// URL reads a file of this machine, so an entry's is
    refused, unread, unless `allow_file_urls` (for entries of one's own)."""
    fetched = cached = 0
    failures = []
    for cell_id, expected in sorted((entry.get("weights") or {}).items()):
        problem = malformed(expected)
        if problem:
            failures.append(f"cells/{cell_id}.safetensors: {problem}")
            continue
        if "url" not in expected:
            continue
        target = weights_cache() / expected["sha256"]
        try:
            _check(target, expected, str(target))
            cached += 1
            continue
        except (OSError, ValueError):
            pass
        if expected["url"].startswith("file:") and not allow_file_urls:
            failures.append(f"cells/{cell_id}.safetensors: its URL is a file:// URL, which reads a file of this "
                            f"machine: not read (--allow-file-urls reads those of entries of your own)")
            continue
        try:
            download(expected["url"], target, expected)
            fetched += 1
        except (FetchError, UsageError) as e:
            failures.append(f"cells/{cell_id}.safetensors: {e}")
    return fetched, cached, failures


def download(url: str, target: Path, expected: dict) -> None:
    """Stream `url` into `target`, at most the recorded size, and keep it only when its sha256 and
    size are the recorded ones. Not torch.hub's download_url_to_file or pooch: neither stops at a size
    while streaming, has an overall deadline or checks each redirect hop."""
    check_url(url, "weights URL")
    target.parent.mkdir(parents=True, exist_ok=True)
    limit = min(expected["size"], MAX_WEIGHTS_BYTES)
    fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.", suffix=".part")
    try:
        digest, size = hashlib.sha256(), 0
        allowed = deadline_s(limit)
        ends = time.monotonic() + allowed
        with os.fdopen(fd, "wb") as out, _open(url) as stream:
            # read1: whatever has arrived, so that the deadline is checked however slowly bytes come.
            while chunk := stream.read1(CHUNK):
                size += len(chunk)
                if size > limit:
                    raise FetchError(f"{url} gives more than the recorded {expected['size']:,} bytes")
                if time.monotonic() > ends:
                    raise FetchError(f"{url} took longer than {allowed:.0f} s, the limit for {expected['size']:,} "
                                     f"bytes ({DEADLINE_BASE_S} s and {MIN_RATE // 1000} kB/s); not kept")
                digest.update(chunk)
                out.write(chunk)
        if (digest.hexdigest(), size) != (expected["sha256"], expected["size"]):
            raise FetchError(f"{url} gives sha256 {digest.hexdigest()[:12]}... ({size:,} bytes); the entry records "
                             f"{expected['sha256'][:12]}... ({expected['size']:,} bytes): not kept")
        os.replace(tmp, target)
    except urllib.error.HTTPError as e:
        if 300 <= e.code < 400:  # urllib's own message for this is three lines
            raise FetchError(f"{url}: redirects in a loop or more than {_Redirects.max_redirections} times "
                             f"(HTTP {e.code})") from None
        raise FetchError(f"{url}: {_one_line(e)}") from None
    except OSError as e:  # urllib's errors are OSErrors too; a refused connection says so in its reason
        reason = e.reason if isinstance(e, urllib.error.URLError) else e
        raise FetchError(f"{url}: {_one_line(reason)}") from None
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def _one_line(error) -> str:
    return " ".join(str(error).split())


class _Redirects(urllib.request.HTTPRedirectHandler):
    """Every hop of a redirect under the first URL's rules: a weights address (check_url), and
    https:// stays https://, so that a redirect cannot lead to plain http:// on another host or on
    this machine."""

    def __init__(self, first: str):
        self.first = first

    def redirect_request(self, req, fp, code, msg, headers, newurl):
        try:
            check_url(newurl, "redirected to")
        except UsageError as e:
            raise FetchError(f"{self.first}: {e}; not followed") from None
        if urlsplit(self.first).scheme == "https" and urlsplit(newurl).scheme != "https":
            raise FetchError(f"{self.first}: redirected to {newurl!r}, not https://; not followed")
        return super().redirect_request(req, fp, code, msg, headers, newurl)


def _open(url: str):
    parts = urlsplit(url)
    if parts.scheme in ("http", "https"):
        return urllib.request.build_opener(_Redirects(url)).open(url, timeout=TIMEOUT_S)
    if parts.scheme == "file":
        path = Path(unquote(parts.path))
        if not path.is_file():
            raise FetchError(f"{url}: not a file")
        return open(path, "rb")
    return open(_hf_download(url), "rb")


def _hf_download(url: str) -> str:
    """hf://[datasets/|spaces/]OWNER/REPO[@REVISION]/PATH through huggingface_hub (its own cache)."""
    rest = url[len("hf://"):]
    repo_type = None
    for kind in ("datasets", "spaces"):
        if rest.startswith(f"{kind}/"):
            repo_type, rest = kind[:-1], rest[len(kind) + 1:]
    parts = rest.split("/", 2)
    if len(parts) != 3 or not all(parts):
        raise FetchError(f"{url} is not hf://OWNER/REPO[@REVISION]/PATH")
    repo, _, revision = parts[1].partition("@")
    try:
        from huggingface_hub import hf_hub_download
    except ImportError:
        raise UsageError(f"{url}: hf:// weights need huggingface_hub; install it with "
                         f"pip install 'tmem-bench[hf]'") from None
    try:
        return hf_hub_download(repo_id=f"{parts[0]}/{repo}", filename=parts[2], revision=revision or None,
                               repo_type=repo_type)
    except Exception as e:  # noqa: BLE001 - the hub's errors are its own classes; each becomes one line
        raise FetchError(f"{url}: {type(e).__name__}: {e}") from None

