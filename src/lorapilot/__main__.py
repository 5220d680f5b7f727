from lorapilot.cli import main

main()
