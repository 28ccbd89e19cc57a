# The rules of every study, generated from its declaration (hpcdl/<study>/__init__.py: SPEC, see
# hpcdl/study.py): run (the PyCOMPSs task app) -> aggregate (tables) -> plot (figures, each with
# its caption in report/<study>/<figure>.rst) -> claims (claims.json / claims.html). Adding a study
# edits nothing here. Snakemake evaluates a `shell:` expression when the job runs, after this loop
# has moved on, so everything study-specific a command needs goes in through `params` (evaluated
# here, per rule).
for _spec in (STUDY_SPECS[_name] for _name in CONFIG["studies"]):
    _dir = f"{RESULTS}/{_spec.name}"
    _cfg = study_cfg_path(_spec.name)

    rule:
        name:
            f"{_spec.name}_run"
        input:
            _cfg,
        output:
            expand(f"{_dir}/raw/{{table}}.csv", table=_spec.raw_tables),
        log:
            f"{_dir}/logs/run.log",
        params:
            app=task_app(_spec.name),
        threads: _spec.run_threads(CONFIG) or all_cores()
        resources:
            **_spec.run_resources(CONFIG),
        conda:
            CONDA_ENV
        shell:
            "{params.app} 2>&1 | tee {log}"

    rule:
        name:
            f"{_spec.name}_aggregate"
        input:
            cfg=_cfg,
            raw=getattr(rules, f"{_spec.name}_run").output,
        output:
            expand(f"{_dir}/tables/{{table}}.csv", table=_spec.tables),
        log:
            f"{_dir}/logs/aggregate.log",
        threads: 1
        resources:
            mem_mb=1000,
            runtime=5,
        conda:
            CONDA_ENV
        params:
            cmd=cli_step("aggregate", _spec.name),
        shell:
            "{params.cmd} > {log} 2>&1"

    rule:
        name:
            f"{_spec.name}_plot"
        input:
            cfg=_cfg,
            tables=getattr(rules, f"{_spec.name}_aggregate").output,
        output:
            [
                report(
                    f"{_dir}/figures/{figure}.png",
                    category=_spec.title,
                    caption=f"report/{_spec.name}/{figure}.rst",
                )
                for figure in _spec.figures
            ],
        log:
            f"{_dir}/logs/plot.log",
        threads: 1
        resources:
            mem_mb=1000,
            runtime=5,
        conda:
            CONDA_ENV
        params:
            cmd=cli_step("plot", _spec.name),
        shell:
            "{params.cmd} > {log} 2>&1"

    rule:
        name:
            f"{_spec.name}_claims"
        input:
            cfg=_cfg,
            tables=getattr(rules, f"{_spec.name}_aggregate").output,
        output:
            json=f"{_dir}/claims.json",
            html=report(
                f"{_dir}/claims.html",
                category=_spec.title,
                caption=f"report/{_spec.name}/claims.rst",
            ),
        log:
            f"{_dir}/logs/claims.log",
        threads: 1
        resources:
            mem_mb=1000,
            runtime=5,
        conda:
            CONDA_ENV
        params:
            cmd=cli_step("claims", _spec.name),
        shell:
            "{params.cmd} > {log} 2>&1"
