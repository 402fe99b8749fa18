"""`python -m tf_adabatch.app --config=NAME|FILE --workdir=W`: see `tf_adabatch.app.cli`."""

from tf_adabatch.app.cli import run_cli

if __name__ == "__main__":
    run_cli()
