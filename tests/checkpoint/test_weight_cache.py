"""The weight cache on a small synthetic GGUF: a missing, truncated or unreadable file is rebuilt
automatically with one line on stderr; same-size corruption is invisible to a (fast) load but
caught by `verify_cache` against the sha256 the manifest recorded at build time; caches built
before hashes were recorded still load, and `record_hashes` adds them."""
import json

import numpy as np
import pytest
from synthetic_gguf import CFG, IDS

import tinydecoder as td
from tinydecoder.checkpoint import gguf_file as gf
from tinydecoder.checkpoint import gguf_loader as gl
from tinydecoder.checkpoint import store
from tinydecoder.cli import main as cli_main


@pytest.fixture
def cached(tiny_file, tmp_path, capsys):
    """The tiny file's cache folder, built (and its build message consumed)."""
    load(tiny_file, tmp_path)
    capsys.readouterr()
    return tmp_path / "cache" / gf.file_sha256(tiny_file)


def load(path, tmp_path, **kw):
    return gl.load_gguf_model(path, cache_root=tmp_path / "cache", progress=False, **kw)


def flip_a_byte(file, offset=-3):
    data = bytearray(file.read_bytes())
    data[offset] ^= 0x40
    file.write_bytes(bytes(data))


def assert_rebuilt_with_one_line(tiny_file, tmp_path, reference, capsys, folder, expect_reason):
    model = load(tiny_file, tmp_path)
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("tinydecoder: rebuilding the weight cache "), err
    assert expect_reason in err and "tiny.gguf" in err
    np.testing.assert_allclose(td.forward(model, IDS), td.forward(reference, IDS), rtol=0, atol=2e-5)
    assert store.verify_cache(folder).problems == []  # the rebuilt cache is whole again
    assert [p.name for p in folder.parent.iterdir()] == [folder.name]  # nothing left aside
    load(tiny_file, tmp_path)
    assert capsys.readouterr().err == ""  # and is used as it is from then on


# ---------------------------------------------------------------- damage a load can see: rebuilt
def test_truncated_npy_is_rebuilt(cached, tiny_file, tmp_path, reference, capsys):
    file = cached / "blk.1.ffn_down.npy"
    full = file.stat().st_size
    file.write_bytes(file.read_bytes()[:full // 2])
    assert_rebuilt_with_one_line(tiny_file, tmp_path, reference, capsys, cached, "blk.1.ffn_down.npy: unreadable")
    assert file.stat().st_size == full


def test_missing_npy_is_rebuilt(cached, tiny_file, tmp_path, reference, capsys):
    (cached / "blk.0.attn_qkv.npy").unlink()
    assert_rebuilt_with_one_line(tiny_file, tmp_path, reference, capsys, cached, "blk.0.attn_qkv.npy: missing")


def test_garbage_npy_header_is_rebuilt(cached, tiny_file, tmp_path, reference, capsys):
    (cached / "output_norm.npy").write_bytes(b"\x93NUMPY garbage")
    assert_rebuilt_with_one_line(tiny_file, tmp_path, reference, capsys, cached, "output_norm.npy: unreadable")


def test_wrong_shape_npy_is_rebuilt(cached, tiny_file, tmp_path, reference, capsys):
    np.save(cached / "blk.0.ffn_norm.npy", np.zeros(3, np.float32))
    assert_rebuilt_with_one_line(tiny_file, tmp_path, reference, capsys, cached,
                                 "blk.0.ffn_norm.npy: holds float32 (3,), expected float32 (64,)")


def test_every_matrix_is_stored_out_major(cached, tiny_file, tmp_path):
    """Each output's weights lie together (Fortran order of the [in, out] shape, the GGUF's own
    byte order), as fast.compiled.few_rows reads them; the norms are vectors; the loaded model's weights,
    its embedding rows and its tied head keep that order (no copy on load)."""
    for name, shape in [("blk.0.ffn_down", (CFG.d_ff, CFG.d_model)), ("blk.1.attn_qkv", None),
                        ("blk.1.attn_output", None), ("blk.0.ffn_gate_up", (CFG.d_model, 2 * CFG.d_ff)),
                        ("token_embd", (CFG.d_model, CFG.vocab_size))]:
        array = np.load(cached / f"{name}.npy", mmap_mode="r")
        assert array.flags.f_contiguous and not array.flags.c_contiguous, name
        assert shape is None or array.shape == shape
    assert np.load(cached / "blk.0.attn_norm.npy", mmap_mode="r").ndim == 1
    model = load(tiny_file, tmp_path)
    layer = model.layers[1]
    assert all(w.flags.f_contiguous for w in (layer.w_qkv, layer.wo, layer.w_gate_up, layer.w_down, model.lm_head))
    assert model.embed.flags.c_contiguous


def test_c_ordered_down_projection_is_rebuilt(cached, tiny_file, tmp_path, reference, capsys):
    file = cached / "blk.0.ffn_down.npy"
    np.save(file, np.ascontiguousarray(np.load(file)))  # same shape and values, C order
    assert_rebuilt_with_one_line(tiny_file, tmp_path, reference, capsys, cached,
                                 "blk.0.ffn_down.npy: not stored in F order")


@pytest.mark.parametrize("damage, reason", [
    (lambda m: m.unlink(), "manifest.json: missing"),
    (lambda m: m.write_text('{"format": 5, "conf'), "manifest.json: unreadable"),
    (lambda m: m.write_text('{"format": 5, "config": {"d_model": -1}}'), "manifest.json: no valid config"),
    (lambda m: m.write_text('{"format": 2}'), "manifest.json: format 2, this version reads format 5"),
    (lambda m: m.write_text(m.read_text().replace('"format": 5', '"format": 4')),
     "manifest.json: format 4, this version reads format 5"),  # a cache from before every matrix was out-major
])
def test_damaged_or_outdated_manifest_is_rebuilt(cached, tiny_file, tmp_path, reference, capsys, damage, reason):
    damage(cached / "manifest.json")
    assert_rebuilt_with_one_line(tiny_file, tmp_path, reference, capsys, cached, reason)


def test_damaged_tokenizer_is_rebuilt(cached, tiny_file, tmp_path, capsys):
    (cached / "tokenizer.json").write_text("{not json")
    tok = gl.load_gguf_tokenizer(tiny_file, cache_root=tmp_path / "cache", progress=False)
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "tokenizer files: unreadable" in err
    assert tok.encode("<|im_end|>") == [2] and tok.encode(" the") == [261]


def test_the_tokenizer_alone_needs_no_weight_cache(tiny_file, tmp_path, capsys, monkeypatch):
    """Before any float32 load, the tokenizer is parsed once and saved alone (<sha256>.tokenizer),
    no weights are dequantised, a later call reads the saved copy, a damaged copy is parsed again;
    once the weight cache exists the tokenizer comes from it."""
    root, sha = tmp_path / "cache", gf.file_sha256(tiny_file)
    tok = gl.load_gguf_tokenizer(tiny_file, cache_root=root, progress=False)
    assert sorted(p.name for p in root.iterdir()) == [f"{sha}.tokenizer"]  # no weights: no <sha256> folder
    assert tok.encode("<|im_end|>") == [2] and tok.encode(" the") == [261]
    parsed = []
    real = store.tokenizer_from_gguf
    monkeypatch.setattr(store, "tokenizer_from_gguf", lambda reader: parsed.append(1) or real(reader))
    assert gl.load_gguf_tokenizer(tiny_file, cache_root=root, progress=False).encode(" the") == [261]
    assert parsed == []  # read from the saved copy
    (root / f"{sha}.tokenizer" / "tokenizer.json").write_text("{not json")
    assert gl.load_gguf_tokenizer(tiny_file, cache_root=root, progress=False).encode(" the") == [261]
    assert parsed == [1]  # damaged: parsed from the file again, and saved whole
    assert gl.load_gguf_tokenizer(tiny_file, cache_root=root, progress=False).encode(" the") == [261]
    assert parsed == [1]
    load(tiny_file, tmp_path)  # a float32 load builds the weight cache, with its own tokenizer
    assert (root / sha / "tokenizer.json").is_file()
    parsed.clear()  # the build parsed it for the weight cache
    (root / f"{sha}.tokenizer" / "tokenizer.json").write_text("{not json")  # no longer read
    assert gl.load_gguf_tokenizer(tiny_file, cache_root=root, progress=False).encode(" the") == [261]
    assert parsed == [] and capsys.readouterr().err == ""


# ---------------------------------------------------------------- same-size damage: verify
def test_new_caches_record_every_file_hash(cached):
    files = json.loads((cached / "manifest.json").read_text())["files"]
    on_disk = sorted(p.name for p in cached.iterdir() if p.name != "manifest.json")
    assert sorted(files) == on_disk and len(on_disk) == 2 + 6 * CFG.n_layers + 2  # + tokenizer files
    assert files["blk.0.attn_qkv.npy"] == gf.file_sha256(cached / "blk.0.attn_qkv.npy")
    report = store.verify_cache(cached)
    assert report.hashes_recorded and report.problems == [] and report.checked == len(on_disk)


def test_flipped_byte_is_caught_by_verify_not_by_a_load(cached, tiny_file, tmp_path, reference, capsys, monkeypatch):
    file = cached / "blk.1.attn_qkv.npy"
    size = file.stat().st_size
    flip_a_byte(file)
    assert file.stat().st_size == size
    hashed = []
    real_sha = store.file_sha256
    monkeypatch.setattr(store, "file_sha256", lambda p: hashed.append(p) or real_sha(p))
    model = load(tiny_file, tmp_path)  # a normal load: no hashing of the cache, no message
    assert capsys.readouterr().err == "" and hashed == []
    assert not np.array_equal(model.layers[1].w_qkv, reference.layers[1].w_qkv)  # the damage is live
    report = store.verify_cache(cached)
    assert len(report.problems) == 1 and report.problems[0].startswith("blk.1.attn_qkv.npy: sha256 ")
    assert "differs from the one recorded" in report.problems[0]


def test_verify_reports_missing_and_truncated_files(cached):
    (cached / "blk.0.ffn_down.npy").unlink()
    (cached / "tokenizer.json").write_text("{}")
    report = store.verify_cache(cached)
    assert report.problems == ["blk.0.ffn_down.npy: missing",
                               "tokenizer.json: sha256 " + gf.file_sha256(cached / "tokenizer.json")[:16]
                               + "... differs from the one recorded at build time ("
                               + json.loads((cached / "manifest.json").read_text())["files"]["tokenizer.json"][:16]
                               + "...)"]


def test_a_cache_without_hashes_still_loads_and_can_record_them(cached, tiny_file, tmp_path, reference, capsys):
    manifest_file = cached / "manifest.json"
    manifest = json.loads(manifest_file.read_text())
    del manifest["files"]  # as written by tinydecoder before hashes were recorded
    manifest_file.write_text(json.dumps(manifest, indent=1))
    stamp = (cached / "blk.0.attn_qkv.npy").stat().st_mtime_ns
    model = load(tiny_file, tmp_path)  # loads as it is: no rebuild, no message
    assert capsys.readouterr().err == "" and (cached / "blk.0.attn_qkv.npy").stat().st_mtime_ns == stamp
    np.testing.assert_allclose(td.forward(model, IDS), td.forward(reference, IDS), rtol=0, atol=2e-5)
    report = store.verify_cache(cached)
    assert not report.hashes_recorded and report.problems == [] and report.checked == 0
    assert store.record_hashes(cached) == 2 + 6 * CFG.n_layers + 2
    report = store.verify_cache(cached)
    assert report.hashes_recorded and report.problems == [] and report.checked == 2 + 6 * CFG.n_layers + 2
    assert {k: v for k, v in json.loads(manifest_file.read_text()).items() if k != "files"} == manifest


# ---------------------------------------------------------------- python -m tinydecoder verify
@pytest.fixture
def verify(tiny_file, tmp_path, monkeypatch, capsys):
    """Run `verify --gguf tiny.gguf ARGS` against the test's cache root: (exit code, stdout lines)."""
    monkeypatch.setenv("TINYDECODER_CACHE", str(tmp_path / "cache"))

    def run(*args):
        code = cli_main(["verify", "--gguf", str(tiny_file), *args])
        return code, capsys.readouterr().out.splitlines()
    return run


def test_cli_verify_a_whole_cache(cached, verify):
    code, lines = verify()
    assert code == 0 and lines == [f"{cached}: all {2 + 6 * CFG.n_layers + 2} files match the sha256 recorded "
                                   f"at build time"]


def test_cli_verify_catches_a_flipped_byte_and_repairs_it(cached, verify, tiny_file, tmp_path, reference, capsys):
    flip_a_byte(cached / "blk.0.ffn_gate_up.npy")
    code, lines = verify()
    assert code == 1 and len(lines) == 2
    assert lines[0].startswith(f"{cached / 'blk.0.ffn_gate_up.npy'}: sha256 ")
    assert lines[1] == (f"{cached}: 1 problem(s); rebuild the cache from its GGUF with: "
                        f"python -m tinydecoder verify --repair --gguf {tiny_file}")
    code, lines = verify("--repair")
    assert code == 0 and lines[-1].endswith("files match the sha256 recorded at build time")
    model = load(tiny_file, tmp_path)
    np.testing.assert_allclose(td.forward(model, IDS), td.forward(reference, IDS), rtol=0, atol=2e-5)


def test_cli_verify_without_hashes_offers_record(cached, verify, capsys):
    manifest = json.loads((cached / "manifest.json").read_text())
    del manifest["files"]
    (cached / "manifest.json").write_text(json.dumps(manifest))
    code, lines = verify()
    assert code == 1 and len(lines) == 1 and "no sha256 recorded" in lines[0] and "--record" in lines[0]
    code, lines = verify("--record")
    assert code == 0 and lines == [f"{cached}: recorded the sha256 of {2 + 6 * CFG.n_layers + 2} files, trusting "
                                   f"them as they are now (--repair would rebuild them from the GGUF instead)"]
    assert verify()[0] == 0


def test_cli_verify_a_cache_folder_and_a_missing_cache(cached, tmp_path, capsys, monkeypatch):
    (cached / "blk.1.ffn_norm.npy").unlink()
    assert cli_main(["verify", "--cache-dir", str(cached)]) == 1
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == f"{cached / 'blk.1.ffn_norm.npy'}: missing"
    assert lines[1].endswith(f"verify --repair --cache-dir {cached}")
    assert cli_main(["verify", "--cache-dir", str(cached), "--repair"]) == 0  # no GGUF known: removed
    assert not cached.exists() and "the next load of its GGUF rebuilds it" in capsys.readouterr().out
    monkeypatch.setenv("TINYDECODER_CACHE", str(tmp_path / "empty"))
    assert cli_main(["verify"]) == 1  # SmolLM2's cache, not built under this root
    assert "no weight cache here, nothing to verify" in capsys.readouterr().out
    assert cli_main(["verify", "--gguf", str(tmp_path / "nope.gguf")]) == 2
    assert capsys.readouterr().err.strip() == f"error: no GGUF file at {tmp_path / 'nope.gguf'}"
    with pytest.raises(SystemExit) as exit_info:
        cli_main(["verify", "--repair", "--record"])
    assert exit_info.value.code == 2


# ---------------------------------------------------------------- two processes at once
def test_a_second_process_waits_for_the_first_build_and_does_not_build_again(tiny_file, tmp_path):
    """While one process builds the cache (holding its lock), a second one starting a load says
    it waits, then finds the cache built: one build, not two, and no lock file left behind."""
    import subprocess
    import sys

    folder = tmp_path / "cache" / gf.file_sha256(tiny_file)
    code = ("import sys; from tinydecoder.checkpoint import gguf_loader as gl; "
            f"m = gl.load_gguf_model({str(tiny_file)!r}, cache_root={str(tmp_path / 'cache')!r}); "
            "print(m.config.n_layers)")
    with store.build_lock(folder):
        second = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                  text=True)
        waiting = second.stderr.readline()  # printed before it blocks on the lock
        assert waiting.startswith("tinydecoder: another process is building ") and "waiting" in waiting, waiting
        store.build_cache(tiny_file, folder, progress=False)
        assert second.poll() is None  # still waiting while the lock is held
    out, err = second.communicate(timeout=60)
    assert second.returncode == 0, err
    assert out.strip() == str(CFG.n_layers) and "first load" not in err and "dequantising" not in err, err
    assert [p.name for p in folder.parent.iterdir()] == [folder.name]  # the lock file is gone
