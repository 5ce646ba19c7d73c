// softblk-fat: the `softblk fat ...` tools as a program of their own.
#include <softblk/fat/cli.hpp>

#include <string>
#include <vector>

int main(int argc, char** argv)
{
    std::vector<char*> args(argv, argv + argc);
    static char name[] = "fat";
    args[0] = name;
    return softblk::fat::cli_main(static_cast<int>(args.size()), args.data());
}
