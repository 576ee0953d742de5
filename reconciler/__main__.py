from reconciler.cli.main import main

raise SystemExit(main())
