# The study bundle (src/predict/bundle/; docs/verify.md): `snakemake --profile slurm bundle`, after `all`, writes
# results/bundle/ and results/bundle.tar.gz: the report, every evaluation and statistics table it reads, the training
# metrics, this test split's campaign ledger lines and a manifest; `predict verify-bundle results/bundle` checks it
# anywhere, without the cluster.
# Beside `all`, not in it: Snakemake's own report archive (`snakemake --report results/report.zip`) can only be made
# once the run it reports has ended, and the bundle takes it in when it is there (a report.zip made later replans the
# bundle); and on the cluster the bundle hashes every evaluated checkpoint (with bundle.weights, copies them): work
# for the run a paper reports, not for every iteration of the design.


localrules:
    bundle,


SNAKEMAKE_REPORT = R("report.zip")


rule bundle:
    input:
        files=BUNDLED,
        data=R("data", "manifest.json"),
        example=REPORT_EXAMPLE,
        snakemake_report=[SNAKEMAKE_REPORT] if Path(SNAKEMAKE_REPORT).exists() else [],
        # every episode as an Inspect log (report.smk: inspect_logs), an optional part verify-bundle never requires
        inspect_logs=rules.inspect_logs.output[0],
    output:
        # the folder's manifest, not the folder: Snakemake marks a directory() output with a file of its own, which
        # would be a file in the bundle that its manifest does not list
        manifest=R("bundle", "manifest.json"),
        archive=R("bundle.tar.gz"),
    params:
        **SLICE("bundle"),
        out_dir=lambda w, output: os.path.dirname(output.manifest),
        snakemake_report=lambda w, input: " ".join(f"--snakemake-report {shlex.quote(p)}" for p in input.snakemake_report),
        inspect_logs=lambda w, input: os.path.dirname(input.inspect_logs),
    log:
        LOG("bundle"),
    benchmark:
        BENCH("bundle")
    conda:
        "../../envs/pipeline.yaml"
    shell:
        "predict bundle --config-slice {params.config:q} --files {input.files:q} --data-manifest {input.data:q}"
        " --report-example {input.example:q} {params.snakemake_report} --inspect-logs {params.inspect_logs:q}"
        " --out-dir {params.out_dir:q}"
        " --archive {output.archive:q} > {log:q} 2>&1"
