"""The course's exercises: `exercises` (check a prediction, print a hint; agree within rounding),
`implement` (the "implement it" exercises: one module of cases per chapter, and the library's
reference for each), and `grading` (run a class's notebooks headless and grade every exercise)."""
