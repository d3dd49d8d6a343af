# Before any serving job is submitted: does `serving.python` import vLLM? Runs on the submitting machine.
# A wrong interpreter fails here in seconds, naming serving.python, instead of in the first GPU job after its
# queue wait (as "No module named 'vllm'" in a server log).


localrules:
    check_serving,


rule check_serving:
    output:
        SERVING_CHECK,
    params:
        **SLICE("check-serving"),
    log:
        LOG("check_serving"),
    conda:
        "../../envs/pipeline.yaml"
    shell:
        "predict check-serving --config-slice {params.config:q} --out {output:q} > {log:q} 2>&1"



# serving.shared (the embedded default): the serving jobs of a run lease ONE vLLM server (STOP_SHARED_SERVER in
# common.smk); when the run ends, either way, it stops at once. (Dry-runs run neither hook.)
onsuccess:
    STOP_SHARED_SERVER()


onerror:
    STOP_SHARED_SERVER()
