"""cuda_library: CUDA C++ (.cu) compiled by the toolkit's nvcc into a cc_library.

Bazel 4.2.3 has no CUDA rules. This macro compiles each .cu file with nvcc (the one
@libtorch//:nvcc finds, see libtorch.bzl) for sm_80 and sm_90, with compute_90 PTX for newer
GPUs, and wraps the objects in a cc_library that links the CUDA runtime. nvcc sees the headers
and include paths of `deps` (cc_library targets: shared __host__ __device__ code, the
launcher's declarations), never LibTorch: a .cu file holds kernels and plain-C++ launchers,
and C++ code compiled by the host compiler wraps them for tensors.

Only a build against a CUDA LibTorch (--config=cuda, LIBTORCH_HAS_CUDA) compiles CUDA: in a
CPU build the cc_library holds just `hdrs` and `deps`, so a CPU build never needs nvcc. Code
that calls a launcher guards the call with `#ifdef LGPT_LIBTORCH_HAS_CUDA` (defined by
@libtorch in CUDA builds).
"""

load("@libtorch//:build_defs.bzl", "LIBTORCH_HAS_CUDA")

# sm_80 (A100) and sm_90 (H100/H200) machine code; compute_90 PTX for later architectures.
_ARCH_FLAGS = [
    "--generate-code=arch=compute_80,code=sm_80",
    "--generate-code=arch=compute_90,code=[sm_90,compute_90]",
]

_NVCC_FLAGS = [
    "-std=c++17",
    "-O3",
    "--expt-relaxed-constexpr",
    "-Xcompiler=-fPIC",
    "-Xcompiler=-Wall",
    "-Werror=all-warnings",
]

def _nvcc_compile_impl(ctx):
    compilation = [dep[CcInfo].compilation_context for dep in ctx.attr.deps]
    headers = depset(ctx.files.hdrs, transitive = [c.headers for c in compilation])
    include_flags = ["-I."]
    for c in compilation:
        for d in c.includes.to_list() + c.quote_includes.to_list() + c.system_includes.to_list():
            include_flags.append("-I" + d)
        for define in c.defines.to_list():
            include_flags.append("-D" + define)
    outputs = []
    for src in ctx.files.srcs:
        stem = ctx.label.name + "/" + src.basename[:-len(".cu")]
        pic = ctx.actions.declare_file(stem + ".pic.o")
        ctx.actions.run(
            executable = ctx.executable._nvcc,
            arguments = _NVCC_FLAGS + _ARCH_FLAGS + ctx.attr.copts + include_flags +
                        ["-c", src.path, "-o", pic.path],
            inputs = depset([src], transitive = [headers]),
            outputs = [pic],
            mnemonic = "Nvcc",
            progress_message = "Compiling CUDA %s" % src.short_path,
            use_default_shell_env = True,
        )
        outputs.append(pic)
    return [DefaultInfo(files = depset(outputs))]

_nvcc_compile = rule(
    implementation = _nvcc_compile_impl,
    attrs = {
        "srcs": attr.label_list(allow_files = [".cu"]),
        "hdrs": attr.label_list(allow_files = True),
        "deps": attr.label_list(providers = [CcInfo]),
        "copts": attr.string_list(),
        "_nvcc": attr.label(
            default = "@libtorch//:nvcc",
            executable = True,
            cfg = "exec",
        ),
    },
)

def cuda_library(name, srcs, hdrs = [], deps = [], copts = [], **kwargs):
    """A cc_library of CUDA kernels (srcs: .cu files) and their host-side headers."""
    if not LIBTORCH_HAS_CUDA:
        native.cc_library(name = name, hdrs = hdrs, deps = deps, **kwargs)
        return
    _nvcc_compile(
        name = name + "_nvcc",
        srcs = srcs,
        hdrs = hdrs,
        deps = deps,
        copts = copts,
        visibility = ["//visibility:private"],
    )
    native.cc_library(
        name = name,
        srcs = [":" + name + "_nvcc"],
        hdrs = hdrs,
        deps = deps + ["@libtorch//:cuda_runtime"],
        **kwargs
    )
