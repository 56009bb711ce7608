from mmrl.cli import main

raise SystemExit(main())
