# The report's front page (docs/architecture.md, "Report"): the verdict of the run, embedded by
# workflows/report/workflow.rst. Its inputs are everything it shows: each study's claims, run
# summary and provenance sidecars, the studies' tables (what paper-vs-ours reads), the papers'
# published results (resources/papers.yaml) and the committed GPU records shown beside them (a new or
# changed record or papers.yaml reruns it).
# Uses (from the Snakefile): CONFIG, CONFIG_FILES, RESULTS, STUDY_SPECS, GPU_RECORDS, CONDA_ENV, wiring,
# gpu_records, write_verdict.
from hpcdl.platform.orchestration import paper_vs_ours


rule verdict:
    input:
        wiring.verdict_inputs(RESULTS, list(STUDY_SPECS.values()), CONFIG),
        [f for spec in STUDY_SPECS.values() for f in wiring.table_files(RESULTS, spec)],
        paper_vs_ours.paper_inputs(),
        gpu_records.record_inputs(GPU_RECORDS, list(STUDY_SPECS)),
    output:
        f"{RESULTS}/verdict.html",
    params:
        studies={name: spec.category for name, spec in STUDY_SPECS.items()},
        gpu_records=GPU_RECORDS,
        config_files=CONFIG_FILES,
    log:
        f"{RESULTS}/logs/verdict.log",
    localrule: True
    conda:
        CONDA_ENV
    run:
        # papers.yaml by its module's path: as a param, the linter reads it as a hard-coded file prefix
        write_verdict(RESULTS, params.studies, output[0], params.gpu_records, str(paper_vs_ours.PAPERS),
                      params.config_files)
