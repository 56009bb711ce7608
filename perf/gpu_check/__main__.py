from perf.gpu_check.runner import main

raise SystemExit(main())
