from isoflop_cli.cli import app

app(prog_name="isoflop")
