# Checkpoint-cost study: save/load cost per format, sync vs async, DCP over ranks,
# bit-identical resume and training overhead vs interval. Each sweep point is one task of
# tasks/checkpoint.py; checkpoints go to <results>/checkpoint/scratch and are deleted after.
CHECKPOINT = f"{RESULTS}/checkpoint"
CHECKPOINT_TITLE = "Checkpoint cost (formats, sync vs async, resume, interval)"
CHECKPOINT_RAW = ["io", "resume", "overhead"]
CHECKPOINT_TABLES = ["io_cost", "resume", "overhead", "young_daly", "failures"]
CHECKPOINT_FIGURES = ["save_load_time", "bandwidth", "blocking", "overhead", "bytes_on_disk", "dcp_ranks"]


rule checkpoint_run:
    input:
        study_cfg_path("checkpoint"),
    output:
        expand(f"{CHECKPOINT}/raw/{{name}}.csv", name=CHECKPOINT_RAW),
    log:
        f"{CHECKPOINT}/logs/run.log",
    params:
        app=task_app("checkpoint"),
    threads: all_cores()
    resources:
        # largest fp32 state held about five times: state, snapshot, staging, loaded copy, slack
        mem_mb=max(2000, 5 * 4 * CONFIG["checkpoint"]["sizes"]["max_params"] // 2**20),
        runtime=60,
        tasks=max([1, *CONFIG["checkpoint"]["dcp_ranks"]]),
        # The DCP points start their ranks with srun inside this N-task allocation.
        mpi="srun",
    conda:
        CONDA_ENV
    shell:
        "{params.app} 2>&1 | tee {log}"


rule checkpoint_aggregate:
    input:
        cfg=study_cfg_path("checkpoint"),
        raw=rules.checkpoint_run.output,
    output:
        expand(f"{CHECKPOINT}/tables/{{name}}.csv", name=CHECKPOINT_TABLES),
    log:
        f"{CHECKPOINT}/logs/aggregate.log",
    threads: 1
    resources:
        mem_mb=1000,
        runtime=5,
    conda:
        CONDA_ENV
    shell:
        cli_step("aggregate", "checkpoint")


rule checkpoint_plot:
    input:
        cfg=study_cfg_path("checkpoint"),
        tables=rules.checkpoint_aggregate.output,
    output:
        [
            report(
                f"{CHECKPOINT}/figures/{name}.png",
                category=CHECKPOINT_TITLE,
                caption=f"report/checkpoint/{name}.rst",
            )
            for name in CHECKPOINT_FIGURES
        ],
    log:
        f"{CHECKPOINT}/logs/plot.log",
    threads: 1
    resources:
        mem_mb=1000,
        runtime=5,
    conda:
        CONDA_ENV
    shell:
        cli_step("plot", "checkpoint")


rule checkpoint_claims:
    input:
        cfg=study_cfg_path("checkpoint"),
        tables=rules.checkpoint_aggregate.output,
    output:
        json=f"{CHECKPOINT}/claims.json",
        html=report(
            f"{CHECKPOINT}/claims.html",
            category=CHECKPOINT_TITLE,
            caption="report/checkpoint/claims.rst",
        ),
    log:
        f"{CHECKPOINT}/logs/claims.log",
    threads: 1
    resources:
        mem_mb=1000,
        runtime=5,
    conda:
        CONDA_ENV
    shell:
        cli_step("claims", "checkpoint")
