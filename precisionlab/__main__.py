from precisionlab.cli import main

main()
