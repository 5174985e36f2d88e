//! Programs in every language, as `(language, file name, source)`: shared by
//! the sandbox and the daemon tests.

/// Per language: a program that prints `hello from <language>`.
pub const HELLO: &[(&str, &str, &str)] = &[
    ("python", "main.py", "print('hello from python')"),
    (
        "javascript",
        "main.js",
        "console.log('hello from javascript')",
    ),
    (
        "c",
        "main.c",
        "#include <stdio.h>\nint main(void){puts(\"hello from c\");return 0;}",
    ),
    (
        "cpp",
        "main.cpp",
        "#include <iostream>\nint main(){std::cout<<\"hello from cpp\"<<std::endl;}",
    ),
    ("bash", "main.sh", "echo hello from bash"),
    ("ruby", "main.rb", "puts 'hello from ruby'"),
    (
        "go",
        "main.go",
        "package main\nimport \"fmt\"\nfunc main(){fmt.Println(\"hello from go\")}",
    ),
];

/// Per language: a program that copies stdin to stdout byte for byte.
pub const ECHO: &[(&str, &str, &str)] = &[
    (
        "python",
        "main.py",
        "import sys\nsys.stdout.buffer.write(sys.stdin.buffer.read())",
    ),
    (
        "javascript",
        "main.js",
        "const c=[];process.stdin.on('data',d=>c.push(d));process.stdin.on('end',()=>process.stdout.write(Buffer.concat(c)));",
    ),
    (
        "c",
        "main.c",
        "#include <stdio.h>\nint main(void){int ch;while((ch=getchar())!=EOF)putchar(ch);return 0;}",
    ),
    (
        "cpp",
        "main.cpp",
        "#include <iostream>\nint main(){char c;std::cin>>std::noskipws;while(std::cin.get(c))std::cout.put(c);}",
    ),
    ("bash", "main.sh", "cat"),
    (
        "ruby",
        "main.rb",
        "STDOUT.binmode; STDIN.binmode; STDOUT.write(STDIN.read)",
    ),
    (
        "go",
        "main.go",
        "package main\nimport (\"io\";\"os\")\nfunc main(){io.Copy(os.Stdout, os.Stdin)}",
    ),
];
