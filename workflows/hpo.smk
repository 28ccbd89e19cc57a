# Hyperparameter optimisation study: Optuna ask-and-tell in tasks/hpo.py, each trial's epoch chunks
# as tasks. The journal (results/hpo/journal/) is not a declared output, so Snakemake never deletes
# it: a rerun after a crash continues the studies instead of starting over.
HPO = f"{RESULTS}/hpo"
HPO_TITLE = "Hyperparameter optimisation (Optuna on PyCOMPSs tasks)"
HPO_RAW = ["trials", "intermediate", "studies"]
HPO_TABLES = ["trials", "intermediate", "best_so_far", "grid_scaling", "pruning"]
HPO_FIGURES = [
    "best_so_far",
    "grid_scaling",
    "optuna_param_importances",
    "optuna_parallel_coordinate",
    "optuna_intermediate_values",
]


rule hpo_run:
    input:
        study_cfg_path("hpo"),
    output:
        expand(f"{HPO}/raw/{{name}}.csv", name=HPO_RAW),
    log:
        f"{HPO}/logs/run.log",
    params:
        app=task_app("hpo"),
    # Concurrent trials at most; Snakemake caps this at --cores.
    threads: max([*CONFIG["hpo"]["grid"]["workers"], CONFIG["hpo"]["workers"]])
    resources:
        mem_mb=4000,
        runtime=60,
    conda:
        CONDA_ENV
    shell:
        "{params.app} 2>&1 | tee {log}"


rule hpo_aggregate:
    input:
        cfg=study_cfg_path("hpo"),
        raw=rules.hpo_run.output,
    output:
        expand(f"{HPO}/tables/{{name}}.csv", name=HPO_TABLES),
        best=report(
            f"{HPO}/tables/best_config.csv",
            category=HPO_TITLE,
            caption="report/hpo/best_config.rst",
        ),
    log:
        f"{HPO}/logs/aggregate.log",
    threads: 1
    resources:
        mem_mb=1000,
        runtime=5,
    conda:
        CONDA_ENV
    shell:
        cli_step("aggregate", "hpo")


rule hpo_plot:
    input:
        cfg=study_cfg_path("hpo"),
        tables=rules.hpo_aggregate.output,
    output:
        [
            report(
                f"{HPO}/figures/{name}.png",
                category=HPO_TITLE,
                caption=f"report/hpo/{name}.rst",
            )
            for name in HPO_FIGURES
        ],
    log:
        f"{HPO}/logs/plot.log",
    threads: 1
    resources:
        mem_mb=1000,
        runtime=5,
    conda:
        CONDA_ENV
    shell:
        cli_step("plot", "hpo")


rule hpo_claims:
    input:
        cfg=study_cfg_path("hpo"),
        tables=rules.hpo_aggregate.output,
    output:
        json=f"{HPO}/claims.json",
        html=report(f"{HPO}/claims.html", category=HPO_TITLE, caption="report/hpo/claims.rst"),
    log:
        f"{HPO}/logs/claims.log",
    threads: 1
    resources:
        mem_mb=1000,
        runtime=5,
    conda:
        CONDA_ENV
    shell:
        cli_step("claims", "hpo")
