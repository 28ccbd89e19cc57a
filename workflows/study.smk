# The rules of every study, generated from its declaration (hpcdl/studies/<study>/__init__.py: SPEC,
# see hpcdl/platform/kit/study.py): run (the PyCOMPSs task app) -> tables -> figures (each with its
# caption in report/<study>/<figure>.rst, whose first line includes the run's part, written beside the
# figure by the figures stage: hpcdl.platform.orchestration.captions) -> claims (claims.json /
# claims.html), and the page that opens the study in the report (about.html); first, the study's
# config file. Each entry's category is the study's short title (StudySpec.category), the menu's. The
# files and commands come from hpcdl.platform.orchestration.wiring; adding a study edits nothing here.
# Snakemake evaluates a `shell:` expression when the job runs, after this loop has moved on, so
# everything study-specific a command needs goes in through `params` (evaluated here, per rule).
# Every report entry of a study has a label that orders its category: its about page (rule
# <study>_about, hpcdl.platform.orchestration.about), its headline figure, the other figures, its claims.
# The about page answers the study's question from its claims, shows its headline figure with its
# caption, sets its published results beside this run's (hpcdl.platform.orchestration.paper_vs_ours:
# resources/papers.yaml, the run's claims and tables) and shows its committed GPU records
# (hpcdl.platform.orchestration.gpu_records): all of them its inputs.
# Uses (from the Snakefile): CONFIG, CONFIG_FILES, RESULTS, STUDY_SPECS, GPU_RECORDS, CONDA_ENV, wiring,
# gpu_records, study_config, json_text; all_cores (common.smk).
from hpcdl.platform.orchestration import paper_vs_ours


# The study's slice of the validated config, as the file its app and stages read. Snakemake reruns
# a study when its params (its block) change, and only that study.
rule study_config:
    output:
        wiring.study_config_path(RESULTS, "{study}"),
    params:
        text=lambda wc: json_text(study_config(CONFIG, wc.study)),
    log:
        f"{RESULTS}/{{study}}/logs/config.log",
    localrule: True
    conda:
        CONDA_ENV
    # a shell step, not `run:`: Snakemake starts a whole new Snakemake process for each `run:` job (about
    # 4 s, for every study of every workflow); written to a temporary file and renamed, so atomic
    shell:
        "printf '%s' {params.text:q} > {output}.tmp && mv {output}.tmp {output}"


for _spec in STUDY_SPECS.values():
    _dir = str(wiring.run_dir(RESULTS, _spec.name).root)
    _cfg = wiring.study_config_path(RESULTS, _spec.name)

    rule:
        name:
            f"{_spec.name}_run"
        input:
            _cfg,
        output:
            wiring.raw_files(RESULTS, _spec, CONFIG),
        log:
            f"{_dir}/logs/run.log",
        params:
            app=wiring.task_app(_spec.name, _cfg, CONFIG),
        threads: _spec.run_threads(CONFIG) or all_cores()
        resources:
            **wiring.run_resources(_spec, CONFIG),
        conda:
            CONDA_ENV
        shell:
            "{params.app} 2>&1 | tee {log}"

    rule:
        name:
            f"{_spec.name}_tables"
        input:
            wiring.stage_inputs(RESULTS, _spec, CONFIG, "tables"),
        output:
            wiring.table_files(RESULTS, _spec),
        log:
            f"{_dir}/logs/tables.log",
        threads: 1
        resources:
            mem_mb=1000,
            runtime=5,
        conda:
            CONDA_ENV
        params:
            cmd=wiring.stage_command(_spec.name, "tables", _cfg),
        shell:
            "{params.cmd} > {log} 2>&1"

    rule:
        name:
            f"{_spec.name}_figures"
        input:
            wiring.stage_inputs(RESULTS, _spec, CONFIG, "figures"),
        output:
            [
                report(path, category=_spec.category, caption=f"report/{_spec.name}/{figure}.rst",
                       labels=wiring.report_label(_spec, figure))
                for figure, path in zip(_spec.figures, wiring.figure_files(RESULTS, _spec))
            ],
            wiring.caption_files(RESULTS, _spec),
        log:
            f"{_dir}/logs/figures.log",
        threads: 1
        resources:
            mem_mb=1000,
            runtime=5,
        conda:
            CONDA_ENV
        params:
            cmd=wiring.stage_command(_spec.name, "figures", _cfg, CONFIG_FILES),
        shell:
            "{params.cmd} > {log} 2>&1"

    rule:
        name:
            f"{_spec.name}_claims"
        input:
            wiring.stage_inputs(RESULTS, _spec, CONFIG, "claims"),
        output:
            json=f"{_dir}/claims.json",
            html=report(
                f"{_dir}/claims.html",
                category=_spec.category,
                caption=f"report/{_spec.name}/claims.rst",
                labels=wiring.report_label(_spec, "claims"),
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
            cmd=wiring.stage_command(_spec.name, "claims", _cfg),
        shell:
            "{params.cmd} > {log} 2>&1"

    rule:
        name:
            f"{_spec.name}_about"
        input:
            wiring.stage_inputs(RESULTS, _spec, CONFIG, "about"),
            f"{_dir}/claims.json",
            wiring.table_files(RESULTS, _spec),
            wiring.headline_files(RESULTS, _spec),
            paper_vs_ours.paper_inputs(),
            gpu_records.record_inputs(GPU_RECORDS, [_spec.name]),
        output:
            report(
                wiring.about_file(RESULTS, _spec),
                category=_spec.category,
                caption="report/about.rst",
                labels=wiring.report_label(_spec, "about"),
            ),
        log:
            f"{_dir}/logs/about.log",
        # a page of a table, a figure and a few sentences: not worth a cluster job
        localrule: True
        threads: 1
        conda:
            CONDA_ENV
        params:
            cmd=wiring.stage_command(_spec.name, "about", _cfg, CONFIG_FILES),
        shell:
            "{params.cmd} > {log} 2>&1"
