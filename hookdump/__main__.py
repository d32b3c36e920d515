from hookdump.cli import main

main()
