# Spatial scaling study: partitioned Conv3d exactness, calibration microbenchmarks, strong/weak/hybrid
# scaling runs (each a task launching its ranks), oracle predictions and the CosmoFlow extrapolation.
SPATIAL = f"{RESULTS}/spatial"
SPATIAL_TITLE = "Spatial scaling (hybrid data x spatial 3D CNN)"
SPATIAL_RAW = ["exactness", "calibration", "runs", "iterations", "ranks"]
SPATIAL_TABLES = ["runs", "loss", "exactness", "calibration_fit", "extrapolation", "strategy_choice"]
SPATIAL_FIGURES = ["strong_scaling", "weak_scaling", "oracle_parity", "extrapolation", "memory", "loss"]


rule spatial_run:
    input:
        study_cfg_path("spatial"),
    output:
        expand(f"{SPATIAL}/raw/{{name}}.csv", name=SPATIAL_RAW),
    log:
        f"{SPATIAL}/logs/run.log",
    params:
        app=task_app("spatial"),
    threads: all_cores()
    resources:
        mem_mb=4000,
        runtime=30,
        tasks=max(
            lay[0] * lay[1] * lay[2]
            for key in ("strong", "weak", "hybrid")
            for lay in CONFIG["spatial"][key]["layouts"] + [CONFIG["spatial"]["train"]["layout"]]
        ),
        # The batch step starts the ranks with srun inside this N-task allocation.
        mpi="srun",
    conda:
        CONDA_ENV
    shell:
        "{params.app} 2>&1 | tee {log}"


rule spatial_aggregate:
    input:
        cfg=study_cfg_path("spatial"),
        raw=rules.spatial_run.output,
    output:
        expand(f"{SPATIAL}/tables/{{name}}.csv", name=SPATIAL_TABLES),
    log:
        f"{SPATIAL}/logs/aggregate.log",
    threads: 1
    resources:
        mem_mb=1000,
        runtime=5,
    conda:
        CONDA_ENV
    shell:
        cli_step("aggregate", "spatial")


rule spatial_plot:
    input:
        cfg=study_cfg_path("spatial"),
        tables=rules.spatial_aggregate.output,
    output:
        [
            report(
                f"{SPATIAL}/figures/{name}.png",
                category=SPATIAL_TITLE,
                caption=f"report/spatial/{name}.rst",
            )
            for name in SPATIAL_FIGURES
        ],
    log:
        f"{SPATIAL}/logs/plot.log",
    threads: 1
    resources:
        mem_mb=1000,
        runtime=5,
    conda:
        CONDA_ENV
    shell:
        cli_step("plot", "spatial")


rule spatial_claims:
    input:
        cfg=study_cfg_path("spatial"),
        tables=rules.spatial_aggregate.output,
    output:
        json=f"{SPATIAL}/claims.json",
        html=report(f"{SPATIAL}/claims.html", category=SPATIAL_TITLE, caption="report/spatial/claims.rst"),
    log:
        f"{SPATIAL}/logs/claims.log",
    threads: 1
    resources:
        mem_mb=1000,
        runtime=5,
    conda:
        CONDA_ENV
    shell:
        cli_step("claims", "spatial")
