"""Repository rule for LibTorch, from Debian's package or any LibTorch distribution.

Where LibTorch comes from is read from the environment, never from a BUILD file:
  LGPT_LIBTORCH          root of a LibTorch distribution (holding include/ and lib/);
                         unset: Debian's libtorch-dev under /usr.
  LGPT_LIBTORCH_FLAVOR   "cuda" (set by --config=cuda): use LGPT_LIBTORCH_CUDA, default the
                         PyPI torch that `./lgpt setup --cuda` installs
                         (~/.cache/lgpt/torch-2.11.0-cu130/torch), and require
                         libtorch_cuda.so there. The CUDA runtime libraries come from the
                         nvidia/ wheels beside it (as torch's own RPATH finds them), the
                         headers of the CUDA toolkit from LGPT_CUDA_HOME, CUDA_HOME or
                         /usr/local/cuda.
The generated repository exposes @libtorch//:libtorch, @libtorch//:cuda_runtime (empty in a
CPU build), @libtorch//:nvcc (the toolkit's nvcc; a file that fails in a CPU build) and
@libtorch//:build_defs.bzl with LIBTORCH_HAS_CUDA.
"""

# The CUDA LibTorch `./lgpt setup --cuda` installs (keep the two in step).
_DEFAULT_CUDA_LIBTORCH = "/.cache/lgpt/torch-2.11.0-cu130/torch"

_HEADER_DIRS = ["torch", "ATen", "c10", "caffe2"]

def _find_debian_libdir(ctx):
    for candidate in ["/usr/lib/x86_64-linux-gnu", "/usr/lib/aarch64-linux-gnu", "/usr/lib64", "/usr/lib"]:
        if ctx.path(candidate + "/libtorch_cpu.so").exists:
            return candidate
    return None

def _libtorch_repository_impl(ctx):
    flavor = ctx.os.environ.get("LGPT_LIBTORCH_FLAVOR", "")
    if flavor == "cuda":
        root = ctx.os.environ.get("LGPT_LIBTORCH_CUDA", "")
        if not root:
            root = ctx.os.environ.get("HOME", "/root") + _DEFAULT_CUDA_LIBTORCH
        include_root = root + "/include"
        libdir = root + "/lib"
        if not ctx.path(libdir + "/libtorch_cuda.so").exists:
            fail("--config=cuda: no CUDA LibTorch at %s (expected %s/libtorch_cuda.so); " % (root, libdir) +
                 "run ./lgpt setup --cuda, or set LGPT_LIBTORCH_CUDA to the root of a CUDA " +
                 "LibTorch distribution")
    elif ctx.os.environ.get("LGPT_LIBTORCH", ""):
        root = ctx.os.environ["LGPT_LIBTORCH"]
        include_root = root + "/include"
        libdir = root + "/lib"
    else:
        include_root = "/usr/include"
        libdir = _find_debian_libdir(ctx)
        if libdir == None:
            fail("LibTorch not found under /usr: install Debian's libtorch-dev (./lgpt setup) " +
                 "or set LGPT_LIBTORCH to a LibTorch distribution")

    if not ctx.path(include_root + "/torch/csrc/api/include/torch/torch.h").exists:
        fail("LibTorch headers not found under %s" % include_root)
    for d in _HEADER_DIRS:
        if ctx.path(include_root + "/" + d).exists:
            ctx.symlink(include_root + "/" + d, "include/" + d)

    has_cuda = ctx.path(libdir + "/libtorch_cuda.so").exists
    libs = ["-ltorch", "-ltorch_cpu", "-lc10"]
    defines = []
    cuda_linkopts = []
    nvcc = None
    if has_cuda:
        # libtorch_cuda registers its kernels from static initialisers: keep it linked.
        # (push/pop: the libraries after them keep the linker's default.)
        libs = ["-Wl,--push-state,--no-as-needed", "-ltorch_cuda", "-lc10_cuda",
                "-Wl,--pop-state"] + libs
        cuda_home = _cuda_home(ctx)
        nvcc = cuda_home + "/bin/nvcc"
        if not ctx.path(nvcc).exists:
            fail("--config=cuda: no nvcc at %s; install the CUDA 13.0 toolkit or set " % nvcc +
                 "LGPT_CUDA_HOME to its root")
        ctx.symlink(cuda_home + "/include", "cuda_include")
        runtime_dirs = _nvidia_lib_dirs(ctx, root)

        # The linker follows libtorch_cuda's needs into the nvidia wheels' folders.
        libs = libs + ["-Wl,-rpath-link," + d for d in runtime_dirs]
        cudart = _find_cudart(ctx, runtime_dirs + [cuda_home + "/lib64"])
        cuda_linkopts = ["-L" + cudart[0], "-l:" + cudart[1], "-Wl,-rpath," + cudart[0]]

        # Code with CUDA paths of its own (kernels, the toolchain check) compiles them in.
        defines.append("LGPT_LIBTORCH_HAS_CUDA")
    if not _uses_glog(ctx, include_root):
        # PyPI's LibTorch logs through c10's own LOG/CHECK macros, which would clash with
        # glog's (lgpt logs with glog): its headers take glog's path instead. c10's own
        # messages still go through c10.
        defines.append("C10_USE_GLOG")
    if include_root != "/usr/include":
        # PyPI's LibTorch (built against an older libstdc++ with the newer parts linked in)
        # exports std::filesystem and std::chrono functions of its own (libtorch.so's
        # remove_all crashes when called from here). The system's libstdc++ comes first in
        # the binaries' NEEDED list, so its definitions are the ones every call binds to.
        libs = ["-Wl,--push-state,--no-as-needed", "-lstdc++", "-Wl,--pop-state"] + libs

    # c10/cuda's headers call the CUDA runtime inline: users of a CUDA LibTorch see the
    # toolkit's headers and link libcudart.
    linkopts = ["-L" + libdir, "-Wl,-rpath," + libdir] + libs + cuda_linkopts + ["-pthread"]
    includes = ["include", "include/torch/csrc/api/include"]
    if has_cuda:
        includes.append("cuda_include")

    ctx.file("BUILD", """# Generated by //third_party:libtorch.bzl from {libdir}
package(default_visibility = ["//visibility:public"])

cc_library(
    name = "libtorch",
    hdrs = glob(["include/**", "cuda_include/**"], exclude = ["cuda_include/cccl/**"]),
    defines = {defines},
    includes = {includes},
    linkopts = {linkopts},
    deps = ["@com_github_google_glog//:glog"],
)

# The CUDA runtime API (headers and libcudart) for code that launches kernels of its own.
cc_library(
    name = "cuda_runtime",
    hdrs = glob(["cuda_include/**"]),
    includes = {cuda_includes},
    linkopts = {cuda_linkopts},
)

{nvcc_rule}
""".format(
        libdir = libdir,
        linkopts = repr(linkopts),
        defines = repr(defines),
        includes = repr(includes),
        cuda_includes = repr(["cuda_include"] if has_cuda else []),
        cuda_linkopts = repr(cuda_linkopts),
        nvcc_rule = _nvcc_rule(ctx, nvcc),
    ))
    ctx.file("build_defs.bzl", "LIBTORCH_HAS_CUDA = %s\nLIBTORCH_LIBDIR = %r\n" % (has_cuda, libdir))

def _cuda_home(ctx):
    for name in ["LGPT_CUDA_HOME", "CUDA_HOME", "CUDA_PATH"]:
        if ctx.os.environ.get(name, ""):
            return ctx.os.environ[name]
    nvcc = ctx.which("nvcc")
    if nvcc != None:
        return str(nvcc.dirname.dirname.realpath)
    return "/usr/local/cuda"

def _nvidia_lib_dirs(ctx, root):
    """The lib/ folders of the nvidia-* wheels installed beside torch/ (site-packages/nvidia)."""
    nvidia = ctx.path(root + "/../nvidia")
    if not nvidia.exists:
        return []
    return [str(d) + "/lib" for d in nvidia.readdir() if ctx.path(str(d) + "/lib").exists]

def _find_cudart(ctx, dirs):
    for d in dirs:
        for name in ["libcudart.so.13", "libcudart.so"]:
            if ctx.path(d + "/" + name).exists:
                return (d, name)
    fail("--config=cuda: libcudart not found in %s" % dirs)

def _uses_glog(ctx, include_root):
    macros = ctx.path(include_root + "/c10/macros/cmake_macros.h")
    if not macros.exists:
        return True
    return "#define C10_USE_GLOG" in ctx.read(macros)

def _nvcc_rule(ctx, nvcc):
    """@libtorch//:nvcc, a script that runs the toolkit's nvcc (or says there is none)."""
    if nvcc == None:
        body = "echo 'nvcc: CUDA code is built only with --config=cuda' >&2\nexit 1\n"
    else:
        body = 'exec "%s" "$@"\n' % nvcc
    ctx.file("nvcc.sh", "#!/bin/sh\n" + body, executable = True)
    return 'sh_binary(name = "nvcc", srcs = ["nvcc.sh"])'

libtorch_repository = repository_rule(
    implementation = _libtorch_repository_impl,
    environ = [
        "LGPT_LIBTORCH",
        "LGPT_LIBTORCH_FLAVOR",
        "LGPT_LIBTORCH_CUDA",
        "LGPT_CUDA_HOME",
        "CUDA_HOME",
        "CUDA_PATH",
        "HOME",
    ],
    local = True,
)
