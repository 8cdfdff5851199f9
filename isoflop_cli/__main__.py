from isoflop_cli.cli import main

main()
