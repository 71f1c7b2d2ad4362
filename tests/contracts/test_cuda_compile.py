"""The GPU kernel sources, checked without a GPU.

- Every ``.cu`` file, as NVRTC gets it (``_kernels.module_code``: the kernels and their
  generated entry points), compiles with ``nvcc --ptx`` for sm_80 and sm_90, with every
  warning an error (skipped only where ``nvcc`` is absent); the PTX holds exactly the entry
  points the backend looks up, by their plain ``extern "C"`` names.
- The kernel table that the CuPy loader and the emulation harness share
  (``gradcells.gpu._kernels``) matches the ``.cu`` signatures parameter by parameter, and
  every ``GC_KERNEL`` of the sources is in it.
- Source composition, entry points and argument building behave (they are the glue between
  the table and a device).
"""

import re
import shutil
import subprocess

import numpy as np
import pytest

from gradcells.gpu import _kernels, _sources

NVCC = shutil.which("nvcc")
ARCHES = ("sm_80", "sm_90")
_KERNEL_SIGNATURE = re.compile(
    r"template\s*<(?P<template>[^>]*(?:<[^>]*>[^>]*)*)>\s*GC_KERNEL\s+void\s+"
    r"(?P<name>\w+)\s*\((?P<params>[^)]*)\)", re.S)


def _signatures(text):
    """name -> (template parameter names, [(ctype, name), ...]) of every ``GC_KERNEL``."""
    found = {}
    for match in _KERNEL_SIGNATURE.finditer(text):
        template = tuple(part.split("=")[0].split()[-1]
                         for part in match.group("template").split(","))
        params = []
        for declaration in match.group("params").split(","):
            words = declaration.split()
            params.append((" ".join(words[:-1]), words[-1]))
        found[match.group("name")] = (template, params)
    return found


def test_every_kernel_file_composes_into_one_self_contained_source():
    for name in _sources.KERNEL_FILES:
        raw = _sources.read(name)
        composed = _sources.compose(name)
        assert '#include "common.cuh"' in raw
        assert "#include" not in composed, f"{name}: an include was left for the compiler"
        assert composed.count("#define GRADCELLS_COMMON_CUH") == 1
        assert "GC_KERNEL void" in composed and not re.search(r"__global__\s+void", composed)
        code = _kernels.module_code(name)
        assert code.startswith(composed)
        # CuPy writes the code to a file in the locale's encoding when it compiles.
        assert code.isascii(), f"{name}: non-ASCII text would not encode in every locale"
        entries = re.findall(r"__global__ void (\w+)\(", code)
        assert tuple(entries) == _kernels.source_entries(name)


def test_composition_is_what_the_cache_key_sees():
    """An edit to the shared header changes every composed source (and so CuPy's cache key)."""
    header = _sources.read("common.cuh")
    for name in _sources.KERNEL_FILES:
        assert header.strip() in _sources.compose(name)


def test_the_kernels_read_from_the_cu_files_are_every_signature_there():
    """``_kernels.KERNELS`` (read from the sources) against a second, independent reading of
    every ``GC_KERNEL`` signature: none missed, none misread; every optional name is a
    parameter of its kernel."""
    declared = {}
    for name in _sources.KERNEL_FILES:
        declared.update({k: (name, *v) for k, v in _signatures(_sources.read(name)).items()})
    assert set(declared) == set(_kernels.KERNELS), "a GC_KERNEL was not read"
    for name, kernel in _kernels.KERNELS.items():
        source, template, params = declared[name]
        assert kernel.source == source
        # Elementwise kernels also take A, defaulted to T's arithmetic type.
        assert template[: len(kernel.template)] == kernel.template
        assert set(template[len(kernel.template):]) <= {"A"}
        assert [(p.ctype, p.name) for p in kernel.params] == params, name
        assert kernel.optional <= set(kernel.param_names), name


def test_every_ld_parameter_follows_its_array():
    for kernel in _kernels.KERNELS.values():
        names = kernel.param_names
        for index, param in enumerate(kernel.params):
            if param.name.startswith("ld_"):
                assert names[index - 1] == param.name[3:] and param.ctype == "long long"


def test_entry_points_cover_every_dtype():
    assert _kernels.source_entries("lstm.cu") == (
        "lstm_forward__float", "lstm_forward__double", "lstm_forward__gc_half",
        "lstm_backward__float", "lstm_backward__double", "lstm_backward__gc_half",
        *(f"{name}__{c}" for name in ("layer_norm_rows", "layer_norm_grad_rows",
                                      "lstm_forward_ln", "lstm_backward_ln",
                                      "lstm_forward_tangent", "layer_norm_tangent_rows",
                                      "lstm_forward_tangent_ln", "lstm_backward_tangent",
                                      "layer_norm_grad_tangent_rows",
                                      "lstm_backward_tangent_ln")
          for c in ("float", "double", "gc_half")))
    assert len(_kernels.source_entries("gru.cu")) == 11 * 3
    assert _kernels.source_entries("rnn.cu") == (
        "rnn_forward__float", "rnn_forward__double", "rnn_forward__gc_half",
        "rnn_backward__float", "rnn_backward__double", "rnn_backward__gc_half",
        "rnn_forward_tangent__float", "rnn_forward_tangent__double",
        "rnn_forward_tangent__gc_half", "rnn_backward_tangent__float",
        "rnn_backward_tangent__double", "rnn_backward_tangent__gc_half")
    assert set(_kernels.source_entries("reduce.cu")) == {
        "column_sum__float__float", "column_sum__double__double",
        "column_sum__gc_half__gc_half", "column_sum__gc_half__float",
        "column_sum__float__gc_half"}
    kernel = _kernels.KERNELS["column_sum"]
    for dtype in _kernels.STORAGE_DTYPES:
        for pair in _kernels.column_sum_dtypes(dtype):
            assert _kernels.entry_name(kernel, pair) in _kernels.source_entries("reduce.cu")


def test_an_entry_point_runs_its_template_with_concrete_types():
    """float16 storage: pointers to gc_half, the arithmetic scalars in float."""
    point = _kernels.entry_point(_kernels.KERNELS["lstm_forward"], (np.float16,))
    assert point.startswith("__global__ void lstm_forward__gc_half(const gc_half* gx, ")
    assert "float forget_bias, float cell_clip, int use_peephole" in point
    assert point.endswith("{ lstm_forward<gc_half>(gx, gh, b, cs_prev, wci, wcf, wco, seq_len, "
                          "h_prev, zoneout_cs, zoneout_h, forget_bias, cell_clip, use_peephole, "
                          "use_clip, use_seq_len, use_zoneout_cs, use_zoneout_h, step, batch, "
                          "hidden, i, cs, f, o, ci, co, h, cs_state, h_state); }")
    point = _kernels.entry_point(_kernels.KERNELS["rnn_backward"], (np.float16,))
    assert point == (
        "__global__ void rnn_backward__gc_half(const gc_half* h, const gc_half* d_h, "
        "const gc_half* dh_next, const gc_half* d_h_final, const int* seq_len, "
        "const gc_half* zoneout_h, int use_relu, int has_d_h, int has_d_h_final, "
        "int use_seq_len, int use_zoneout_h, long long step, long long n_steps, "
        "long long batch, long long hidden, gc_half* d_z, gc_half* dh_zoned)\n"
        "{ rnn_backward<gc_half>(h, d_h, dh_next, d_h_final, seq_len, zoneout_h, use_relu, "
        "has_d_h, has_d_h_final, use_seq_len, use_zoneout_h, step, n_steps, batch, hidden, "
        "d_z, dh_zoned); }")
    point = _kernels.entry_point(_kernels.KERNELS["column_sum"], (np.float16, np.float32))
    assert point.startswith("__global__ void column_sum__gc_half__float(const gc_half* in, ")
    assert "float* out)" in point and "column_sum<gc_half, float>(in, " in point


def _forward_values(n_batch=2, n_hidden=3, dtype=np.float32):
    gates = np.zeros((n_batch, 4 * n_hidden), dtype)
    state = np.zeros((n_batch, n_hidden), dtype)
    values = {name: state for name in ("cs_prev", "wci", "wcf", "wco", "h_prev", "zoneout_cs",
                                       "zoneout_h", "i", "cs", "f", "o", "ci", "co", "h",
                                       "cs_state", "h_state")}
    values.update(gx=gates, gh=gates, b=np.zeros(4 * n_hidden, dtype),
                  seq_len=np.zeros(0, np.int32), forget_bias=1.0, cell_clip=0.0,
                  use_peephole=True, use_clip=0, use_seq_len=np.int64(0), use_zoneout_cs=0,
                  use_zoneout_h=0, step=0, batch=n_batch, hidden=n_hidden)
    return values


def test_arguments_come_out_in_cu_order_with_exact_types():
    kernel = _kernels.KERNELS["lstm_forward"]
    for dtype, compute in ((np.float32, np.float32), (np.float64, np.float64),
                           (np.float16, np.float32)):
        args = _kernels.arguments(kernel, (dtype,), **_forward_values(dtype=dtype))
        assert len(args) == len(kernel.params)
        by_name = dict(zip(kernel.param_names, args, strict=True))
        assert type(by_name["forget_bias"]) is compute and by_name["forget_bias"] == 1.0
        assert type(by_name["use_peephole"]) is np.int32 and by_name["use_peephole"] == 1
        assert type(by_name["use_seq_len"]) is np.int32
        assert type(by_name["step"]) is np.int64 and type(by_name["hidden"]) is np.int64
        assert by_name["gx"].dtype == dtype and by_name["seq_len"].dtype == np.int32


def test_a_launch_may_leave_the_zoneout_arguments_out():
    """``Kernel.optional``: left out, the flags are 0 and the arrays one of the launch's."""
    for kernel in _kernels.KERNELS.values():
        assert kernel.optional <= set(kernel.param_names), kernel.name
    kernel = _kernels.KERNELS["lstm_forward"]
    values = {k: v for k, v in _forward_values().items() if k not in kernel.optional}
    by_name = dict(zip(kernel.param_names, _kernels.arguments(kernel, (np.float32,), **values),
                       strict=True))
    assert by_name["use_zoneout_cs"] == 0 and by_name["use_zoneout_h"] == 0
    assert by_name["zoneout_h"] is values["gx"] and by_name["h_prev"] is values["gx"]
    del values["gx"]
    with pytest.raises(TypeError, match=re.escape("missing arguments ['gx']")):
        _kernels.arguments(kernel, (np.float32,), **values)


@pytest.mark.parametrize("change, error, words", [
    ({"gx": np.zeros((2, 12), np.float64)}, TypeError, "gx must have dtype float32"),
    ({"cs_prev": np.zeros((3, 2), np.float32).T}, ValueError, "cs_prev must be C-contiguous"),
    ({"seq_len": np.zeros(2, np.int64)}, TypeError, "seq_len must have dtype int32"),
    ({"gx": [0.0] * 24}, TypeError, "gx must be an array"),
    ({"step": 1.5}, TypeError, "step must be an integer"),
    ({"forget_bias": "1"}, TypeError, "forget_bias must be a real number"),
    ({"step": 2**63}, ValueError, "does not fit int64"),
    ({"use_clip": 2**31}, ValueError, "does not fit int32"),
    ({"unknown": 1}, TypeError, "unknown ['unknown']"),
])
def test_arguments_reject_what_a_launch_would_misread(change, error, words):
    values = {**_forward_values(), **change}
    with pytest.raises(error, match=re.escape(words)):
        _kernels.arguments(_kernels.KERNELS["lstm_forward"], (np.float32,), **values)


def test_arguments_accept_row_views_only_with_their_stride():
    kernel = _kernels.KERNELS["gru_gates"]
    wide = np.zeros((2, 9), np.float32)  # [B, 3H] with H = 3: r, u then c
    state = np.zeros((2, 3), np.float32)
    values = dict(gx_ru=wide[:, :6], ld_gx_ru=9, gh_ru=np.zeros((2, 6), np.float32),
                  ld_gh_ru=6, b_ru=np.zeros(6, np.float32), h_prev=state,
                  seq_len=np.zeros(0, np.int32), use_seq_len=0, step=0, batch=2, hidden=3,
                  r=state, u=state, rh=state)
    assert len(_kernels.arguments(kernel, (np.float32,), **values)) == len(kernel.params)
    with pytest.raises(ValueError, match="gx_ru must be rows of stride ld_gx_ru=6"):
        _kernels.arguments(kernel, (np.float32,), **{**values, "ld_gx_ru": 6})


def test_launch_shapes_cover_every_element():
    policy = _kernels.DEFAULT_POLICY
    for n in (1, 255, 256, 257, 10**6, 10**9):
        (grid, _, _), (block, _, _) = _kernels.elementwise_shape(n, policy)
        assert 1 <= grid <= policy.max_grid and block == policy.block
        assert grid * block >= n or grid == policy.max_grid  # else the grid-stride loop
    for rows, cols in ((0, 5), (1, 1), (64, 3), (65, 3), (10**6, 8), (4096, 4096)):
        parts, per_part = _kernels.column_sum_plan(rows, cols, policy)
        assert parts >= 1 and (parts - 1) * per_part < max(rows, 1) <= parts * per_part
        (gx, gy, _), _ = _kernels.column_sum_shape(cols, parts, policy)
        assert 1 <= gx <= policy.max_grid and 1 <= gy <= min(parts, policy.max_grid)


@pytest.mark.skipif(NVCC is None, reason="nvcc is not installed")
@pytest.mark.parametrize("arch", ARCHES)
@pytest.mark.parametrize("name", _sources.KERNEL_FILES)
def test_nvcc_compiles_every_kernel_to_ptx(tmp_path, name, arch):
    source = tmp_path / name
    source.write_text(_kernels.module_code(name))
    ptx = tmp_path / f"{source.stem}.{arch}.ptx"
    result = subprocess.run(
        [NVCC, "--ptx", f"-arch={arch}", "-Werror", "all-warnings", "-o", str(ptx),
         str(source)], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, f"nvcc failed for {name} ({arch}):\n{result.stderr}"
    text = ptx.read_text()
    assert f".target {arch}" in text
    entries = re.findall(r"\.visible \.entry (\w+)\(", text)
    assert sorted(entries) == sorted(_kernels.source_entries(name))
    # No fast-math approximations of division or square root slipped in.
    assert "div.approx" not in text and "div.full" not in text and "sqrt.approx" not in text
