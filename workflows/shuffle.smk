# Shuffle-fraction study: global / local / partial-Q shuffling over real ranks, plus KAKURENBO.
# Each sweep point is one task of tasks/shuffle.py that launches its M ranks.
SHUFFLE = f"{RESULTS}/shuffle"
SHUFFLE_TITLE = "Shuffle fraction (global / local / partial-Q, KAKURENBO)"
SHUFFLE_RAW = ["epochs", "points"]
SHUFFLE_TABLES = ["epochs", "final", "kakurenbo"]
SHUFFLE_FIGURES = ["acc_vs_epoch", "final_acc_vs_q", "time_per_epoch_vs_q", "bytes_vs_q", "kakurenbo"]


rule shuffle_run:
    input:
        study_cfg_path("shuffle"),
    output:
        expand(f"{SHUFFLE}/raw/{{name}}.csv", name=SHUFFLE_RAW),
    log:
        f"{SHUFFLE}/logs/run.log",
    params:
        app=task_app("shuffle"),
    threads: all_cores()
    resources:
        mem_mb=4000,
        runtime=60,
        tasks=max(
            [m for grid in CONFIG["shuffle"]["grids"] for m in grid["world_sizes"]]
            + [CONFIG["shuffle"]["kakurenbo"]["world_size"]]
        ),
        # The batch step starts the ranks with srun inside this N-task allocation.
        mpi="srun",
    conda:
        CONDA_ENV
    shell:
        "{params.app} 2>&1 | tee {log}"


rule shuffle_aggregate:
    input:
        cfg=study_cfg_path("shuffle"),
        raw=rules.shuffle_run.output,
    output:
        expand(f"{SHUFFLE}/tables/{{name}}.csv", name=SHUFFLE_TABLES),
    log:
        f"{SHUFFLE}/logs/aggregate.log",
    threads: 1
    resources:
        mem_mb=1000,
        runtime=5,
    conda:
        CONDA_ENV
    shell:
        cli_step("aggregate", "shuffle")


rule shuffle_plot:
    input:
        cfg=study_cfg_path("shuffle"),
        tables=rules.shuffle_aggregate.output,
    output:
        [
            report(
                f"{SHUFFLE}/figures/{name}.png",
                category=SHUFFLE_TITLE,
                caption=f"report/shuffle/{name}.rst",
            )
            for name in SHUFFLE_FIGURES
        ],
    log:
        f"{SHUFFLE}/logs/plot.log",
    threads: 1
    resources:
        mem_mb=1000,
        runtime=5,
    conda:
        CONDA_ENV
    shell:
        cli_step("plot", "shuffle")


rule shuffle_claims:
    input:
        cfg=study_cfg_path("shuffle"),
        tables=rules.shuffle_aggregate.output,
    output:
        json=f"{SHUFFLE}/claims.json",
        html=report(f"{SHUFFLE}/claims.html", category=SHUFFLE_TITLE, caption="report/shuffle/claims.rst"),
    log:
        f"{SHUFFLE}/logs/claims.log",
    threads: 1
    resources:
        mem_mb=1000,
        runtime=5,
    conda:
        CONDA_ENV
    shell:
        cli_step("claims", "shuffle")
