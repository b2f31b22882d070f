"""The layers of lgpt, bottom to top: the packages of each layer and the layers it may use.

Every package with libraries ends its BUILD file with library_deps(), a genquery of what its
libraries depend on; tests:layering_test checks those against this table.
"""

LAYERS = [
    struct(name = "base", packages = ["core/base"], uses = []),
    struct(name = "config", packages = ["core/config"], uses = ["base"]),
    struct(name = "ops", packages = ["core/ops"], uses = ["base"]),
    struct(name = "io", packages = ["core/io"], uses = ["base"]),
    struct(name = "text", packages = ["core/text"], uses = ["base", "config"]),
    struct(name = "constrain", packages = ["core/constrain"], uses = ["base"]),
    struct(name = "convert", packages = ["core/convert"], uses = ["base", "config", "io"]),
    struct(name = "nn", packages = ["core/nn"], uses = ["base", "config", "ops"]),
    struct(name = "cache", packages = ["cache"], uses = ["base", "ops"]),
    struct(name = "dist", packages = ["core/dist"], uses = ["base", "config", "ops", "nn"]),
    struct(
        name = "attention",
        packages = ["attention"],
        uses = ["base", "config", "ops", "nn", "cache"],
    ),
    struct(
        name = "model",
        packages = ["core/model", "core/speculative"],
        uses = ["base", "config", "ops", "io", "nn", "cache", "attention", "dist"],
    ),
    struct(
        name = "peft",
        packages = ["peft"],
        uses = ["base", "config", "ops", "io", "nn", "cache", "attention", "dist", "model"],
    ),
    struct(
        name = "serving",
        packages = ["core/serving"],
        uses = [
            "base",
            "config",
            "ops",
            "io",
            "nn",
            "cache",
            "attention",
            "dist",
            "model",
            "constrain",
        ],
    ),
    struct(
        name = "train",
        packages = ["core/train"],
        uses = ["base", "config", "ops", "io", "nn", "cache", "attention", "dist", "model"],
    ),
    struct(
        name = "top",
        packages = ["", "tests", "tools", "tools/server"],
        uses = [
            "base",
            "config",
            "ops",
            "io",
            "text",
            "constrain",
            "convert",
            "nn",
            "cache",
            "attention",
            "dist",
            "model",
            "peft",
            "serving",
            "train",
        ],
    ),
]

def library_deps():
    """Declares :library_deps, the cc_library targets this package's libraries depend on.

    Call it at the end of a BUILD file (after every cc_library).
    """
    package = native.package_name()
    libraries = [
        rule
        for rule in native.existing_rules().values()
        if rule["kind"] == "cc_library"
    ]
    targets = ["//%s:%s" % (package, rule["name"]) for rule in libraries]
    native.genquery(
        name = "library_deps",
        expression = "kind('cc_library', deps(%s))" % " + ".join(targets),
        scope = targets,
        testonly = any([rule.get("testonly", False) for rule in libraries]),
        visibility = ["//tests:__pkg__"],
    )
