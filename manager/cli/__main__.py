from manager.cli.main import run

run()
