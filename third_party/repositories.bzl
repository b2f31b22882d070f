"""Declares every system dependency of lgpt as a Bazel repository.

Targets depend on these labels (@libtorch, @com_google_absl//:status, ...) and never write
-l flags or include paths themselves.
"""

load("//third_party:libtorch.bzl", "libtorch_repository")

def lgpt_dependencies():
    libtorch_repository(name = "libtorch")
    for name in ["com_google_absl", "com_google_googletest", "com_github_google_glog",
                 "com_github_gflags_gflags", "com_github_google_benchmark",
                 "com_github_jbeder_yaml_cpp", "com_github_nlohmann_json",
                 "com_github_google_sentencepiece", "com_googlesource_code_re2", "libpng", "libedit",
                 "zlib", "com_github_yhirose_cpp_httplib"]:
        native.new_local_repository(
            name = name,
            path = "/usr",
            build_file = "//third_party:%s.BUILD" % name,
        )
