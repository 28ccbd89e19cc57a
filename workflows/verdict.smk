# The report's front page (docs/architecture.md, "Report"): the verdict of the run, embedded by
# workflows/report/workflow.rst. Its inputs are everything it shows: each study's claims, run
# summary and provenance sidecars.
# Uses (from the Snakefile): CONFIG, RESULTS, STUDY_SPECS, CONDA_ENV, wiring, write_verdict.
rule verdict:
    input:
        wiring.verdict_inputs(RESULTS, list(STUDY_SPECS.values()), CONFIG),
    output:
        f"{RESULTS}/verdict.html",
    params:
        studies={name: spec.title for name, spec in STUDY_SPECS.items()},
    log:
        f"{RESULTS}/logs/verdict.log",
    localrule: True
    conda:
        CONDA_ENV
    run:
        write_verdict(RESULTS, params.studies, output[0])
